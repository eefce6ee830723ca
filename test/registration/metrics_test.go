package registration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/version"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestOperatorMetricsAndTheDashboard runs the operator (and the conversation service) on the
// embedded broker with their own registries, makes a fleet do what a platform team watches
// (Agents Ready and governed, a credential rotation, a deletion, a request through the service),
// and then reads the metrics from the registries: Agents and policies by condition, broker
// commands with their latency, rotations. It then checks that every metric the Grafana dashboard
// and the example alerts (config/monitoring) query is one the project exports.
func TestOperatorMetricsAndTheDashboard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := testenv.StartBroker(t, ctx, "embedded")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(version.NewCollector())
	ns := cp.StartOperator(t, ctx, "metrics-", b.Backend, b.URL, controllers.Options{Metrics: reg, Gating: true})
	secretKey := client.ObjectKey{Namespace: ns, Name: "conversation-service-credentials"}
	if err := registration.EnsureServiceCredentials(ctx, k8s, b.Backend, secretKey); err != nil {
		t.Fatalf("service credentials: %v", err)
	}
	applyManifest(t, ctx, ns, "apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata: {name: governed}\nspec:\n  agentSelector: {matchLabels: {role: auditor}}\n")
	for _, a := range []struct{ name, labels string }{{"auditor", "{role: auditor}"}, {"caller", "{}"}, {"leaver", "{}"}} {
		applyManifest(t, ctx, ns, fmt.Sprintf("apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata: {name: %s, labels: %s}\nspec:\n  orgID: acme\n  unitID: metrics\n  callers: {scope: SameUnit}\n  card: {name: %s, description: d}\n", a.name, a.labels, a.name))
	}
	secrets := map[string]*corev1.Secret{}
	eventually(t, "three Agents Ready", func() error {
		for _, name := range []string{"auditor", "caller", "leaver"} {
			a := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) {
				return fmt.Errorf("%s: %v", name, a.Status.Conditions)
			}
			s := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: a.Status.CredentialsSecret}, s); err != nil {
				return err
			}
			secrets[name] = s
		}
		return nil
	})
	eventually(t, "agents by condition", func() error {
		return wantSeries(reg, controllers.MetricAgents, map[string]string{"condition": "Ready", "status": "True"}, 3)
	})
	if err := wantSeries(reg, controllers.MetricConversationPolicies, map[string]string{"condition": "Conflicted", "status": "False"}, 1); err != nil {
		t.Error(err)
	}

	// A rotation, then a deletion (an unregister).
	a := &a2av1.Agent{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "caller"}, a); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(a.DeepCopy())
	a.Annotations = map[string]string{controllers.AnnotationRotateCredentials: "1"}
	if err := k8s.Patch(ctx, a, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a counted rotation", func() error {
		return wantSeries(reg, controllers.MetricCredentialRotations, map[string]string{"reason": controllers.EventCredentialsRotated}, 1)
	})
	if err := k8s.Delete(ctx, &a2av1.Agent{ObjectMeta: a2aMeta(ns, "leaver")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "broker commands counted", func() error {
		for _, op := range []string{"register", "unregister", "apply_shared"} {
			if err := wantSeries(reg, controllers.MetricBrokerOperations, map[string]string{"operation": op, "result": "ok"}, -1); err != nil {
				return err
			}
		}
		return nil
	})
	families := gather(t, reg)
	h := families[controllers.MetricBrokerOperationTime]
	if h == nil || len(h.GetMetric()) < 3 || h.GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
		t.Fatalf("broker command latency: %v", h)
	}

	// The conversation service, with one request through it to the governed agent.
	svcSecret := &corev1.Secret{}
	if err := k8s.Get(ctx, secretKey, svcSecret); err != nil {
		t.Fatal(err)
	}
	svcReg := prometheus.NewRegistry()
	svcReg.MustRegister(version.NewCollector())
	svc, err := convservice.Start(ctx, convservice.Config{
		BrokerURL: b.URL, Username: string(svcSecret.Data["username"]), Password: string(svcSecret.Data["password"]),
		ReplicaID: "metrics", Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: true,
		RestConfig: cp.Config, Namespace: ns, Registry: svcReg,
		SweepInterval: 100 * time.Millisecond, ResyncInterval: 500 * time.Millisecond, StatsInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("start conversation service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	eventually(t, "the service gates the auditor", func() error {
		if len(svc.GatedAgents()) != 1 {
			return fmt.Errorf("gated: %v", svc.GatedAgents())
		}
		return nil
	})
	caller := secrets["caller"]
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(caller), caller); err != nil { // rotated above
		t.Fatal(err)
	}
	callerID := string(caller.Data["clientID"])
	conn := testenv.DialAgent(t, b.Addr, callerID, string(caller.Data["password"]))
	// As the SDK sends it: the profile has the requester choose the task and context ids.
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("hi"))
	msg.TaskID, msg.ContextID = a2a.TaskID(uuid.NewString()), uuid.NewString()
	params, err := json.Marshal(&a2a.SendMessageRequest{Message: msg})
	if err != nil {
		t.Fatal(err)
	}
	request := `{"jsonrpc":"2.0","id":"1","method":"SendMessage","params":` + string(params) + `}`
	eventually(t, "a request counted by the service", func() error {
		resp, err := conn.PublishWith(&paho.Publish{QoS: 1, Topic: "$a2a/v1/request/acme/metrics/auditor", Payload: []byte(request),
			Properties: &paho.PublishProperties{ResponseTopic: "$a2a/v1/reply/" + callerID + "/m", CorrelationData: []byte("c1")}})
		if err != nil {
			return err
		}
		if err := wantSeries(svcReg, "a2a_conversation_requests_total", nil, -1); err != nil {
			fams, _ := svcReg.Gather()
			var names []string
			for _, f := range fams {
				names = append(names, f.GetName())
			}
			return fmt.Errorf("%w (PUBACK %d; exported: %v)", err, resp.ReasonCode, names)
		}
		return nil
	})
	// Nobody serves the auditor, so no context becomes active: the stats loop reports the gauge
	// of the gated agent at 0.
	eventually(t, "the service's stats loop reports the gated agent's contexts", func() error {
		return wantSeries(svcReg, "a2a_conversation_active_contexts", nil, 0)
	})

	exported := map[string]dto.MetricType{}
	for name, f := range gather(t, reg) {
		exported[name] = f.GetType()
	}
	for name, f := range gather(t, svcReg) {
		exported[name] = f.GetType()
	}
	// controller-runtime's own (reconcile, work queue): registered on its registry by the managers
	// this process runs.
	crFamilies, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range crFamilies {
		exported[f.GetName()] = f.GetType()
	}
	checkQueries(t, exported)
}

func a2aMeta(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

// wantSeries finds the series of name whose labels include labels; n >= 0 wants its value to be
// n, n < 0 any value above 0.
func wantSeries(g prometheus.Gatherer, name string, labels map[string]string, n float64) error {
	families, err := g.Gather()
	if err != nil {
		return err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if (n >= 0 && v == n) || (n < 0 && v > 0) {
				return nil
			}
			return fmt.Errorf("%s%v = %v, want %v", name, labels, v, n)
		}
		return fmt.Errorf("%s: no series with %v", name, labels)
	}
	return fmt.Errorf("%s not exported", name)
}

func gather(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

// metricName is a PromQL metric selector: a name followed by a label matcher or a range.
var metricName = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]`)

// projectMetric is any token with a prefix of a metric the project or controller-runtime exports.
var projectMetric = regexp.MustCompile(`\b((?:a2a_|controller_runtime_|workqueue_)[a-zA-Z0-9_:]*)`)

// checkQueries requires every metric named in the dashboard's queries and in the alerts'
// expressions to be exported (a histogram's _bucket, _sum and _count series by its family).
func checkQueries(t *testing.T, exported map[string]dto.MetricType) {
	t.Helper()
	root := filepath.Join("..", "..")
	var exprs []string
	raw, err := os.ReadFile(filepath.Join(root, "config", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	raw, err = os.ReadFile(filepath.Join(root, "config", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatalf("alerts: %v", err)
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			alerts++
		}
	}
	if len(exprs) < 10 || alerts < 2 {
		t.Fatalf("%d queries and %d alerts: the files lost their content", len(exprs), alerts)
	}
	names := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllStringSubmatch(e, -1) {
			names[m[1]] = true
		}
		for _, m := range projectMetric.FindAllStringSubmatch(e, -1) {
			names[m[1]] = true
		}
	}
	var missing []string
	for name := range names {
		if !isExported(name, exported) {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("queries name metrics nobody exports: %s", strings.Join(missing, ", "))
	}
	t.Logf("%d queries name %d metrics, all exported", len(exprs), len(names))
}

func isExported(name string, exported map[string]dto.MetricType) bool {
	if _, ok := exported[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if family, ok := strings.CutSuffix(name, suffix); ok && exported[family] == dto.MetricType_HISTOGRAM {
			return true
		}
	}
	return false
}
