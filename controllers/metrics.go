package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

// The operator's own metric names (docs/install.md, "Monitoring"), beside controller-runtime's
// controller_runtime_reconcile_* and workqueue_* on the same registry.
const (
	MetricAgents                = "a2a_fleet_agents"
	MetricConversationPolicies  = "a2a_fleet_conversation_policies"
	MetricBrokerOperations      = "a2a_fleet_broker_operations_total"
	MetricBrokerOperationTime   = "a2a_fleet_broker_operation_duration_seconds"
	MetricCredentialRotations   = "a2a_fleet_credential_rotations_total"
	brokerOperationRegister     = "register"
	brokerOperationUnregister   = "unregister"
	brokerOperationApplyShared  = "apply_shared"
	brokerResultOK, brokerError = "ok", "error"
)

// metrics are the operator's instruments, registered on Options.Metrics (cmd/manager and
// cmd/devstack pass controller-runtime's registry, served on /metrics; a test passes its own).
// Counts of objects by condition are read from the manager's cache when scraped, so they are
// never out of step with status and cost nothing between scrapes.
type metrics struct {
	brokerOps         *prometheus.CounterVec
	brokerTime        *prometheus.HistogramVec
	credentialChanges *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, cache client.Reader) (*metrics, error) {
	m := &metrics{
		brokerOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricBrokerOperations,
			Help: "Broker commands the operator issued, by operation (register: an Agent's client, role and card; unregister; apply_shared: a unit, org or gates role) and result (ok, error).",
		}, []string{"operation", "result"}),
		brokerTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricBrokerOperationTime,
			Help:    "Time of one broker command (all its round trips), by operation.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"operation"}),
		credentialChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricCredentialRotations,
			Help: "Agent credentials replaced, by reason: CredentialsRotated (a rotation asked for, or the identity rewritten) or CredentialsRecreated (the Secret was deleted). A new Agent's first credentials are not counted.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.brokerOps, m.brokerTime, m.credentialChanges, &conditionCollector{cache: cache}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) credentialsReplaced(reason string) {
	if m != nil {
		m.credentialChanges.WithLabelValues(reason).Inc()
	}
}

// observe records one broker command.
func (m *metrics) observe(operation string, start time.Time, err error) {
	result := brokerResultOK
	if err != nil {
		result = brokerError
	}
	m.brokerOps.WithLabelValues(operation, result).Inc()
	m.brokerTime.WithLabelValues(operation).Observe(time.Since(start).Seconds())
}

// instrumentedRegistrar counts and times every broker command of the controllers.
type instrumentedRegistrar struct {
	Registrar
	m *metrics
}

func (r instrumentedRegistrar) Register(ctx context.Context, agent *a2av1.Agent, creds registration.Credentials) error {
	start := time.Now()
	err := r.Registrar.Register(ctx, agent, creds)
	r.m.observe(brokerOperationRegister, start, err)
	return err
}

func (r instrumentedRegistrar) Unregister(ctx context.Context, agent *a2av1.Agent) error {
	start := time.Now()
	err := r.Registrar.Unregister(ctx, agent)
	r.m.observe(brokerOperationUnregister, start, err)
	return err
}

func (r instrumentedRegistrar) ApplyShared(ctx context.Context, key registration.SharedKey, members []registration.Member) error {
	start := time.Now()
	err := r.Registrar.ApplyShared(ctx, key, members)
	r.m.observe(brokerOperationApplyShared, start, err)
	return err
}

var (
	agentsDesc = prometheus.NewDesc(MetricAgents,
		"Agents by condition type and status (Ready, Registered, ACLsSynced, IdentityPermitted, WorkloadAvailable, Connected: connected agents are condition=\"Connected\",status=\"True\"), read from the operator's cache at scrape time.",
		[]string{"condition", "status"}, nil)
	policiesDesc = prometheus.NewDesc(MetricConversationPolicies,
		"ConversationPolicies by condition type and status (Ready, Conflicted: policy conflicts are condition=\"Conflicted\",status=\"True\"), read from the operator's cache at scrape time.",
		[]string{"condition", "status"}, nil)
)

// conditionCollector counts Agents and ConversationPolicies by condition when scraped. Every
// replica's cache holds every object, so each replica reports the whole fleet: aggregate with
// max, not sum, across replicas.
type conditionCollector struct {
	cache client.Reader
}

func (c *conditionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- agentsDesc
	ch <- policiesDesc
}

func (c *conditionCollector) Collect(ch chan<- prometheus.Metric) {
	// The cache answers from memory; the bound covers a scrape before it has synced.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var agents a2av1.AgentList
	if err := c.cache.List(ctx, &agents); err == nil {
		counts := map[[2]string]int{}
		for i := range agents.Items {
			countConditions(counts, agents.Items[i].Status.Conditions)
		}
		emit(ch, agentsDesc, counts)
	}
	var policies a2av1.ConversationPolicyList
	if err := c.cache.List(ctx, &policies); err == nil {
		counts := map[[2]string]int{}
		for i := range policies.Items {
			countConditions(counts, policies.Items[i].Status.Conditions)
		}
		emit(ch, policiesDesc, counts)
	}
}

func countConditions(counts map[[2]string]int, conds []metav1.Condition) {
	for _, cond := range conds {
		counts[[2]string{cond.Type, string(cond.Status)}]++
	}
}

func emit(ch chan<- prometheus.Metric, desc *prometheus.Desc, counts map[[2]string]int) {
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}
