package registration_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// BenchmarkFleetRegistration applies a fleet of Agents (FLEET_AGENTS, default 1000) against the
// real control plane and a real Mosquitto with dynsec, and measures the time until every Agent is
// Ready, the broker commands per agent, the ACL entries per agent and the process's peak RSS.
//
//	make bench-fleet                 # 1 000 agents
//	make bench-fleet FLEET_AGENTS=10000
func BenchmarkFleetRegistration(b *testing.B) {
	n := fleetSize()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
		broker := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
		user, pass := broker.DynSecAdmin()
		backend, err := dynsec.Connect(ctx, dynsec.Config{URL: broker.URL(), Username: user, Password: pass})
		if err != nil {
			b.Fatalf("connect dynsec: %v", err)
		}
		runFleetBenchmark(b, ctx, n, backend, broker.URL())
		_ = backend.Close(context.Background())
		cancel()
	}
}

// BenchmarkFleetRegistrationEmbedded is the same fleet on the embedded broker: the operator's own
// throughput, without Mosquitto's per-command cost (the baseline of the same run).
func BenchmarkFleetRegistrationEmbedded(b *testing.B) {
	n := fleetSize()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
		srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0"})
		if err != nil {
			b.Fatalf("start embedded broker: %v", err)
		}
		runFleetBenchmark(b, ctx, n, srv.Backend(), srv.URL())
		_ = srv.Close()
		cancel()
	}
}

func fleetSize() int {
	if v, err := strconv.Atoi(os.Getenv("FLEET_AGENTS")); err == nil && v > 0 {
		return v
	}
	return 1000
}

func runFleetBenchmark(b *testing.B, ctx context.Context, n int, backend acl.Backend, brokerURL string) {
	// One namespace per org, each bound to its org by a Tenant (a namespace claims one org).
	namespaces := cp.StartTenantOperator(b, ctx, "bench-", backend, brokerURL, controllers.Options{}, "org0", "org1")

	// A mixed fleet: 2 orgs × 10 units, a third of each caller scope, teams of 10 (label), and
	// 1 % of the agents with a selector rule admitting another team.
	start := time.Now()
	var created atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				a := &a2av1.Agent{
					ObjectMeta: metav1.ObjectMeta{Namespace: namespaces[fmt.Sprintf("org%d", i%2)], Name: fmt.Sprintf("a%05d", i), Labels: map[string]string{"team": strconv.Itoa(i / 10)}},
					Spec: a2av1.AgentSpec{
						OrgID: fmt.Sprintf("org%d", i%2), UnitID: fmt.Sprintf("unit%d", i%10),
						Card: a2av1.AgentCardSpec{Name: "bench", Description: "benchmark agent"},
						Callers: a2av1.CallersSpec{Scope: []a2av1.CallerScope{
							a2av1.CallerScopeNone, a2av1.CallerScopeSameUnit, a2av1.CallerScopeSameOrg,
						}[i%3]},
					},
				}
				if i%100 == 0 {
					// A rule admits one other team of 10: rules select bounded sets, as teams do.
					a.Spec.Callers.From = []a2av1.CallerSelector{{AgentSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": strconv.Itoa(i/10 + 1)}}}}
				}
				if err := k8s.Create(ctx, a); err != nil {
					errs <- err
					return
				}
				created.Add(1)
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("create agent: %v", err)
	}
	createdIn := time.Since(start)

	ready := 0
	for ready < n {
		if ctx.Err() != nil {
			b.Fatalf("only %d/%d agents Ready after %s", ready, n, time.Since(start).Round(time.Second))
		}
		var list a2av1.AgentList
		if err := k8s.List(ctx, &list, client.HasLabels{"team"}); err != nil {
			if ctx.Err() != nil {
				continue // report the last count above
			}
			b.Fatalf("list: %v", err)
		}
		ready = 0
		for i := range list.Items {
			if meta.IsStatusConditionTrue(list.Items[i].Status.Conditions, a2av1.ConditionReady) {
				ready++
			}
		}
		if ready < n {
			time.Sleep(250 * time.Millisecond)
		}
	}
	elapsed := time.Since(start)

	stats := backend.Stats()
	st, err := backend.Observe(ctx, nil)
	if err != nil {
		b.Fatalf("observe: %v", err)
	}
	entries := 0
	for _, r := range st.Roles {
		entries += len(r.ACLs)
	}
	var secrets corev1.SecretList
	_ = k8s.List(ctx, &secrets, client.HasLabels{"a2a.fleet.dev/agent"})

	b.ReportMetric(elapsed.Seconds(), "s-to-all-ready")
	b.ReportMetric(createdIn.Seconds(), "s-to-create")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "agents/s")
	b.ReportMetric(float64(stats.Mutations)/float64(n), "dynsec-cmds/agent")
	b.ReportMetric(float64(stats.RoundTrips)/float64(n), "dynsec-roundtrips/agent")
	b.ReportMetric(float64(entries)/float64(n), "acl-entries/agent")
	b.ReportMetric(float64(len(st.Clients)), "broker-clients")
	b.ReportMetric(peakRSSMiB(), "peak-RSS-MiB")
	b.Logf("%d agents (%d secrets) Ready in %s; %d dynsec mutations, %d round trips; %d roles, %d groups, %d ACL entries",
		n, len(secrets.Items), elapsed.Round(time.Millisecond), stats.Mutations, stats.RoundTrips, len(st.Roles), len(st.Groups), entries)
}

// peakRSSMiB is this process's high-water resident set (VmHWM): the operator's controllers,
// caches and broker clients, plus the benchmark's own client.
func peakRSSMiB() float64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
