package cluster

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// families is one scrape of a /metrics endpoint, by metric family name.
type families map[string]*dto.MetricFamily

// scrape reads a pod's /metrics through the API server's pod proxy (what Prometheus inside the
// cluster reads on the same port) and parses Prometheus's text format.
func scrape(ctx context.Context, namespace, pod string) (families, error) {
	status, body, err := env.PodGet(ctx, namespace, pod, "8080", "/metrics")
	if err != nil {
		return nil, err
	}
	if status != 200 {
		return nil, fmt.Errorf("GET %s/%s:8080/metrics: %d %s", namespace, pod, status, tail(string(body), 5))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse %s/%s's metrics: %w", namespace, pod, err)
	}
	return fams, nil
}

// labelled reports whether a series carries every label given.
func labelled(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}

// sum adds the values of a family's series that carry the labels given (a counter's or gauge's
// value, a histogram's sample count); found says whether any series matched.
func (f families) sum(name string, want map[string]string) (total float64, found bool) {
	for _, m := range f[name].GetMetric() {
		if !labelled(m, want) {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		}
	}
	return total, found
}

// byConditions is a gauge labelled condition and status, as "Type=Status" -> value.
func (f families) byConditions(name string) map[string]int {
	out := map[string]int{}
	for _, m := range f[name].GetMetric() {
		var cond, status string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "condition":
				cond = l.GetValue()
			case "status":
				status = l.GetValue()
			}
		}
		out[cond+"="+status] = int(m.GetGauge().GetValue())
	}
	return out
}

// countConditions counts the API's objects by condition, as the operator's gauges should.
func countConditions(into map[string]int, conds []metav1.Condition) {
	for _, c := range conds {
		into[c.Type+"="+string(c.Status)]++
	}
}

// apiConditionCounts reads every Agent and ConversationPolicy of the cluster from the API server.
func apiConditionCounts(ctx context.Context) (agents, policies map[string]int, err error) {
	agents, policies = map[string]int{}, map[string]int{}
	var al a2av1.AgentList
	if err := env.Client.List(ctx, &al); err != nil {
		return nil, nil, err
	}
	for i := range al.Items {
		countConditions(agents, al.Items[i].Status.Conditions)
	}
	var pl a2av1.ConversationPolicyList
	if err := env.Client.List(ctx, &pl); err != nil {
		return nil, nil, err
	}
	for i := range pl.Items {
		countConditions(policies, pl.Items[i].Status.Conditions)
	}
	return agents, policies, nil
}

func formatCounts(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// scrapeAll scrapes every ready pod of a selector in the install's namespace.
func scrapeAll(ctx context.Context, selector string) (map[string]families, error) {
	pods, err := env.Pods(ctx, Namespace, selector)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no ready pod for %s", selector)
	}
	out := map[string]families{}
	for _, p := range pods {
		f, err := scrape(ctx, Namespace, p.Name)
		if err != nil {
			return nil, err
		}
		out[p.Name] = f
	}
	return out, nil
}

// sumOver adds a series over the pods' scrapes (a counter only the leader moves, or one every
// replica moves for its own work).
func sumOver(scrapes map[string]families, name string, want map[string]string) (float64, bool) {
	var total float64
	found := false
	for _, f := range scrapes {
		v, ok := f.sum(name, want)
		total += v
		found = found || ok
	}
	return total, found
}

// installedMetrics scrapes the installed operator's and conversation service's /metrics and
// finds what a platform team alerts on, consistent with the cluster: Agents and
// ConversationPolicies by condition equal to the API's counts (connected agents, Ready agents,
// conflicted policies among them) on every replica; reconciles, their errors and latency by
// controller; broker commands with their latency and result; a credential rotation counted once;
// the build of each pod; and the service's requests, which rise with a governed request.
func (b *bus) installedMetrics(ctx context.Context, t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(env.Root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(string(raw))

	// Agents and policies by condition: every replica's cache holds the whole fleet, so each
	// replica's gauges equal the API's counts (once the caches have the last status write).
	var operator map[string]families
	var apiAgents, apiPolicies map[string]int
	err = Poll(ctx, time.Minute, "every operator replica's a2a_fleet_agents and a2a_fleet_conversation_policies equal the API's counts", func(ctx context.Context) (bool, string, error) {
		if apiAgents, apiPolicies, err = apiConditionCounts(ctx); err != nil {
			return false, "", err
		}
		if operator, err = scrapeAll(ctx, operatorPods); err != nil {
			return false, err.Error(), nil
		}
		for pod, f := range operator {
			if got := f.byConditions("a2a_fleet_agents"); !maps.Equal(got, apiAgents) {
				return false, fmt.Sprintf("%s: agents [%s], API [%s]", pod, formatCounts(got), formatCounts(apiAgents)), nil
			}
			if got := f.byConditions("a2a_fleet_conversation_policies"); !maps.Equal(got, apiPolicies) {
				return false, fmt.Sprintf("%s: policies [%s], API [%s]", pod, formatCounts(got), formatCounts(apiPolicies)), nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if apiAgents["Ready=True"] == 0 || apiAgents["Connected=True"] == 0 || apiPolicies["Ready=True"] == 0 {
		t.Fatalf("the samples have no Ready or connected Agent, or no Ready policy, to count: agents [%s], policies [%s]", formatCounts(apiAgents), formatCounts(apiPolicies))
	}
	t.Logf("%d operator replicas report the API's counts: agents [%s]; policies [%s] (conflicted: %d)",
		len(operator), formatCounts(apiAgents), formatCounts(apiPolicies), apiPolicies["Conflicted=True"])

	// Reconciles by controller: their count, errors (a series per controller, zero or not) and
	// latency. The workers run on the leader only, so the sums over the replicas are the leader's.
	for _, controller := range []string{"agent", "conversationpolicy"} {
		sel := map[string]string{"controller": controller}
		n, _ := sumOver(operator, "controller_runtime_reconcile_total", sel)
		_, errorsFound := sumOver(operator, "controller_runtime_reconcile_errors_total", sel)
		timed, _ := sumOver(operator, "controller_runtime_reconcile_time_seconds", sel)
		if n == 0 || !errorsFound || timed == 0 {
			t.Errorf("controller %s: %v reconciles, errors series found %v, %v timed reconciles", controller, n, errorsFound, timed)
		}
		errs, _ := sumOver(operator, "controller_runtime_reconcile_errors_total", sel)
		t.Logf("controller %s: %v reconciles, %v errors, %v in the latency histogram", controller, n, errs, timed)
	}

	// Broker commands: every Agent was registered with a result, and each replica's latency
	// histogram counts exactly the commands its counter counts.
	agents := &a2av1.AgentList{}
	if err := env.Client.List(ctx, agents); err != nil {
		t.Fatal(err)
	}
	registered, _ := sumOver(operator, "a2a_fleet_broker_operations_total", map[string]string{"operation": "register", "result": "ok"})
	if registered < float64(len(agents.Items)) {
		t.Errorf("a2a_fleet_broker_operations_total{operation=register,result=ok} is %v, fewer than the %d Agents", registered, len(agents.Items))
	}
	for pod, f := range operator {
		for _, op := range []string{"register", "unregister", "apply_shared"} {
			commands, _ := f.sum("a2a_fleet_broker_operations_total", map[string]string{"operation": op})
			timed, _ := f.sum("a2a_fleet_broker_operation_duration_seconds", map[string]string{"operation": op})
			if commands != timed {
				t.Errorf("%s: %v %s commands counted, %v timed", pod, commands, op, timed)
			}
		}
	}
	failed, _ := sumOver(operator, "a2a_fleet_broker_operations_total", map[string]string{"result": "error"})
	t.Logf("broker commands: %v registers ok for %d Agents, %v failed commands", registered, len(agents.Items), failed)

	// The build of every pod, operator and service.
	service, err := scrapeAll(ctx, "app.kubernetes.io/name=conversation-service")
	if err != nil {
		t.Fatal(err)
	}
	for pod, f := range mergeScrapes(operator, service) {
		ms := f["a2a_fleet_build_info"].GetMetric()
		if len(ms) != 1 || !labelled(ms[0], map[string]string{"version": release}) || ms[0].GetGauge().GetValue() != 1 {
			t.Errorf("%s: a2a_fleet_build_info is %v, want one series of version %s", pod, ms, release)
			continue
		}
		for _, l := range ms[0].GetLabel() {
			if l.GetName() == "commit" && (l.GetValue() == "" || l.GetValue() == "unknown") {
				t.Errorf("%s: a2a_fleet_build_info names no commit", pod)
			}
		}
	}

	b.rotationCounted(ctx, t, "memory")
	b.serviceRequestsCounted(ctx, t, service)
}

func mergeScrapes(a, b map[string]families) map[string]families {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

// rotationCounted asks for one Agent's credentials to be rotated and finds
// a2a_fleet_credential_rotations_total{reason="CredentialsRotated"} one higher, then waits for
// the Agent to be Ready and connected with its new password.
func (b *bus) rotationCounted(ctx context.Context, t *testing.T, name string) {
	const metric = "a2a_fleet_credential_rotations_total"
	rotated := map[string]string{"reason": "CredentialsRotated"}
	before, err := scrapeAll(ctx, operatorPods)
	if err != nil {
		t.Fatal(err)
	}
	was, _ := sumOver(before, metric, rotated)
	pods, err := env.Pods(ctx, samplesNamespace, "a2a.fleet.dev/agent="+name)
	if err != nil || len(pods) != 1 {
		t.Fatalf("want 1 ready pod of %s before the rotation, got %d (%v)", name, len(pods), err)
	}
	agent := &a2av1.Agent{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, agent); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(agent.DeepCopy())
	if agent.Annotations == nil {
		agent.Annotations = map[string]string{}
	}
	agent.Annotations["a2a.fleet.dev/rotate-credentials"] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := env.Client.Patch(ctx, agent, patch); err != nil {
		t.Fatal(err)
	}
	var now float64
	err = Poll(ctx, 2*time.Minute, metric+" one higher after a rotation", func(ctx context.Context) (bool, string, error) {
		after, err := scrapeAll(ctx, operatorPods)
		if err != nil {
			return false, err.Error(), nil
		}
		now, _ = sumOver(after, metric, rotated)
		return now > was, fmt.Sprintf("%v, was %v", now, was), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The rotation is over once the pod that reads the new password replaced the old one and the
	// Agent is Ready and connected again (the later subtests find the samples as they were).
	err = Poll(ctx, 3*time.Minute, "a new ready pod of "+name, func(ctx context.Context) (bool, string, error) {
		now, err := env.Pods(ctx, samplesNamespace, "a2a.fleet.dev/agent="+name)
		if err != nil {
			return false, "", err
		}
		return len(now) == 1 && now[0].UID != pods[0].UID, fmt.Sprintf("%d ready pods", len(now)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 3*time.Minute, true, name); err != nil {
		t.Fatal(err)
	}
	// Once the Agent is Ready again nothing else rotates: the counter moved by exactly one.
	after, err := scrapeAll(ctx, operatorPods)
	if err != nil {
		t.Fatal(err)
	}
	if now, _ = sumOver(after, metric, rotated); now != was+1 {
		t.Errorf("%s{reason=CredentialsRotated} went from %v to %v for one rotation", metric, was, now)
	}
	t.Logf("one rotation of %s: %s{reason=CredentialsRotated} %v -> %v", name, metric, was, now)
}

// serviceRequestsCounted sends a governed request (confirm's first turn, decided by the
// conversation service) and finds the service's request counter and proxy latency histogram
// higher, and its gated agents counted.
func (b *bus) serviceRequestsCounted(ctx context.Context, t *testing.T, before map[string]families) {
	requests, _ := sumOver(before, "a2a_conversation_requests_total", nil)
	proxied, _ := sumOver(before, "a2a_conversation_proxy_latency_seconds", nil)
	if _, _, state, out := b.send(ctx, t, 2*time.Minute, "acme/demo/confirm", "rename the metrics bucket"); state != "input-required" {
		t.Fatalf("confirm's first turn: want input-required, got %s\n%s", state, out)
	}
	after, err := scrapeAll(ctx, "app.kubernetes.io/name=conversation-service")
	if err != nil {
		t.Fatal(err)
	}
	requestsNow, _ := sumOver(after, "a2a_conversation_requests_total", nil)
	proxiedNow, _ := sumOver(after, "a2a_conversation_proxy_latency_seconds", nil)
	if requestsNow <= requests || proxiedNow <= proxied {
		t.Errorf("after a governed request: a2a_conversation_requests_total %v -> %v, proxy latency samples %v -> %v; want both higher", requests, requestsNow, proxied, proxiedNow)
	}
	// The gated agents (confirm and memory are governed) are consumed by some replica.
	if gated, ok := sumOver(after, "a2a_conversation_gated_agents", nil); !ok || gated == 0 {
		t.Errorf("a2a_conversation_gated_agents is %v over the replicas (exported: %v), want the governed samples", gated, ok)
	}
	if _, ok := sumOver(after, "a2a_conversation_history_bytes", nil); !ok {
		t.Errorf("the service exports no a2a_conversation_history_bytes")
	}
	t.Logf("conversation service: requests %v -> %v, proxied %v -> %v after one governed request", requests, requestsNow, proxied, proxiedNow)
}
