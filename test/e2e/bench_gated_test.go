package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// BenchmarkServiceGatedFleet measures what gating a fleet costs each
// request: the service on the embedded broker answers the same requests to
// one agent first while it gates only the suite's agents, then while it also
// gates E2E_BENCH_GATED (default 1 000) more Agents, each admitting callers
// by a label selector. Both phases run in one process, one after the other;
// the fleet phase's ratios to the base phase are the cost of the fleet.
// Before each phase's requests the process idles for idleWindow with the
// service consuming its agents: the CPU it spends then (and redis-server's) is
// what gating the fleet costs when nothing is asked. E2E_BENCH_GATED_STORE=redis
// runs the service on Redis (one replica, leases renewed every 5 s) instead of
// bbolt.
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
	useRedis := os.Getenv("E2E_BENCH_GATED_STORE") == "redis"
	var redisAddr string
	start := func(replica string, gated int) (*convservice.Service, time.Duration) {
		var svc *convservice.Service
		store := "bolt:" + filepath.Join(b.TempDir(), "state.db")
		if useRedis {
			redisAddr = startRedis(b) // a fresh one per phase
			store = "redis://" + redisAddr + "/0"
		}
		began := time.Now()
		labeled("service", func() {
			var err error
			svc, err = convservice.Start(ctx, convservice.Config{
				BrokerURL: st.brokerURL, Username: st.svcUser, Password: st.svcPass, ReplicaID: replica,
				Store:      store,
				RestConfig: restCfg, Namespace: st.ns, Logger: benchLogger(),
				CallerRate: -1, // one requester drives it flat out
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
		b.Logf("load average before: %s", hostload.Average())
		svc, _ := start("gated-base", len(gatedNames))
		baseIdle, baseRedisIdle := idleCPU(b, ctx, redisAddr, "gated-base")
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
		fleetIdle, fleetRedisIdle := idleCPU(b, ctx, redisAddr, "gated-fleet")
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
		b.ReportMetric(baseIdle, "base-idle-cpu-ms/s")
		b.ReportMetric(fleetIdle, "fleet-idle-cpu-ms/s")
		if useRedis {
			b.ReportMetric(baseRedisIdle, "base-idle-redis-cpu-ms/s")
			b.ReportMetric(fleetRedisIdle, "fleet-idle-redis-cpu-ms/s")
		}
		b.Logf("load average after: %s", hostload.Average())
	}
}

// idleWindow is how long a phase idles before its requests: three rounds of
// the Redis ownership loop (every third of the 15 s lease TTL).
const idleWindow = 15 * time.Second

// idleCPU waits idleWindow with no request and returns the CPU this process
// and (when redisAddr is set) redis-server spent, in ms per second.
func idleCPU(b *testing.B, ctx context.Context, redisAddr, name string) (self, redisSrv float64) {
	b.Helper()
	if dir := os.Getenv("E2E_BENCH_PROFILE_DIR"); dir != "" {
		f, err := os.Create(filepath.Join(dir, name+"-idle.pprof"))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	redisCPU := func() time.Duration {
		if redisAddr == "" {
			return 0
		}
		c := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer c.Close()
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatalf("redis INFO cpu: %v", err)
		}
		var total float64
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_sys" || k == "used_cpu_user" {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
		return time.Duration(total * float64(time.Second))
	}
	cpu0, redis0, began := cpuTime(), redisCPU(), time.Now()
	select {
	case <-time.After(idleWindow):
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	secs := time.Since(began).Seconds()
	return float64((cpuTime() - cpu0).Milliseconds()) / secs, float64((redisCPU() - redis0).Milliseconds()) / secs
}
