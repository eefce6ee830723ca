package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// BenchmarkServiceGatedFleet measures what gating a fleet costs each
// request: the service on the embedded broker answers the same requests to
// one agent first while it gates only the suite's agents, then while it also
// gates E2E_BENCH_GATED (default 1 000) more Agents, each admitting callers
// by a label selector. Both phases run in one process, one after the other;
// the fleet phase's ratios to the base phase are the cost of the fleet.
//
//	go test ./test/e2e/ -run '^$' -bench BenchmarkServiceGatedFleet -benchtime 1x
func BenchmarkServiceGatedFleet(b *testing.B) {
	extra := 1000
	if n, err := strconv.Atoi(os.Getenv("E2E_BENCH_GATED")); err == nil && n > 0 {
		extra = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	st := newStack(b, ctx, "embedded")
	labeled("agent", func() {
		startRawAgent(b, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	})
	requester := st.requester(b, ctx)
	tr := requester.Transport(ref("raw"))
	start := func(replica string, gated int) (*convservice.Service, time.Duration) {
		var svc *convservice.Service
		began := time.Now()
		labeled("service", func() {
			var err error
			svc, err = convservice.Start(ctx, convservice.Config{
				BrokerURL: st.brokerURL, Username: st.svcUser, Password: st.svcPass, ReplicaID: replica,
				Store:      "bolt:" + filepath.Join(b.TempDir(), "state.db"),
				RestConfig: restCfg, Namespace: st.ns, Logger: benchLogger(),
			})
			if err != nil {
				b.Fatalf("start conversation service: %v", err)
			}
		})
		b.Cleanup(func() { _ = svc.Close() })
		eventually(b, 5*time.Minute, "service consumes every gated agent", func() error {
			if got := len(svc.GatedAgents()); got != gated {
				return fmt.Errorf("%d gated agents consumed, want %d", got, gated)
			}
			return nil
		})
		return svc, time.Since(began)
	}

	b.ResetTimer()
	for range b.N {
		b.Logf("load average before: %s", loadavg())
		svc, _ := start("gated-base", len(gatedNames))
		base := benchRun(b, ctx, tr, "gated-base")
		_ = svc.Close()

		created := time.Now()
		for i := range extra {
			apply(b, ctx, st.ns, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: fleet-%d, labels: {role: gated}}
spec:
  orgID: %s
  unitID: fleet%d
  card: {name: fleet-%d, description: gated fleet agent}
  callers:
    scope: SameUnit
    from: [{agentSelector: {matchLabels: {role: gated}}}]
`, i, org, i%10, i))
		}
		eventually(b, 10*time.Minute, "fleet Agents Ready with a delivery topic", func() error {
			var list a2av1.AgentList
			if err := k8s.List(ctx, &list, client.InNamespace(st.ns)); err != nil {
				return err
			}
			ready := 0
			for i := range list.Items {
				a := &list.Items[i]
				if meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) && a.Status.Topics != nil && a.Status.Topics.Delivery != "" {
					ready++
				}
			}
			if want := len(gatedNames) + extra; ready != want {
				return fmt.Errorf("%d gated Agents Ready, want %d", ready, want)
			}
			return nil
		})
		b.Logf("%d more gated Agents Ready in %s", extra, time.Since(created).Round(time.Millisecond))
		svc, consumed := start("gated-fleet", len(gatedNames)+extra)
		b.Logf("service consuming %d gated agents %s after its start", len(gatedNames)+extra, consumed.Round(time.Millisecond))
		fleet := benchRun(b, ctx, tr, "gated-fleet")
		_ = svc.Close()

		for name, res := range map[string]benchResult{"base": base, "fleet": fleet} {
			b.ReportMetric(float64(res.p50.Microseconds()), name+"-p50-µs")
			b.ReportMetric(float64(res.p99.Microseconds()), name+"-p99-µs")
			b.ReportMetric(res.rps, name+"-req/s")
			b.ReportMetric(float64(res.cpu.Microseconds()), name+"-cpu-µs/req")
		}
		b.ReportMetric(float64(fleet.p50)/float64(base.p50), "fleet-p50/base")
		b.ReportMetric(fleet.rps/base.rps, "fleet-rps/base")
		b.ReportMetric(float64(fleet.cpu)/float64(base.cpu), "fleet-cpu/base")
		b.ReportMetric(consumed.Seconds(), "fleet-consume-s")
		b.Logf("load average after: %s", loadavg())
	}
}
