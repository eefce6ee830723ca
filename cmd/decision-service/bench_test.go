package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// BenchmarkReplicaPass: a replica over a fleet of DECISION_BENCH_AGENTS Agents (default 1 000;
// scopes None, SameUnit and SameOrg in turn over 10 units, one callers.from rule per 100, as the
// fleet benchmark's; one org and namespace per 1 000), their credential Secrets written directly (no operator): the first full
// pass (cache synced to table built), a pass with nothing changed (what every later change
// waits for: a pass recompiles the whole fleet), and the replica's heap per Agent (cache and
// table). docs/benchmarks.md, "The decision service called by Mosquitto".
func BenchmarkReplicaPass(b *testing.B) {
	n := 1000
	if v := os.Getenv("DECISION_BENCH_AGENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("DECISION_BENCH_AGENTS %q: %v", v, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	// One namespace and org per 1 000 Agents (a Tenant's default Agent limit).
	var namespaces []string
	created := time.Now()
	for i := range n {
		if i%1000 == 0 {
			ns := cp.NewNamespace(b, ctx, "decision-bench-")
			cp.BindNamespace(b, ctx, ns, fmt.Sprintf("org%d", i/1000))
			namespaces = append(namespaces, ns)
		}
		ns := namespaces[i/1000]
		a := &a2av1.Agent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("a%05d", i), Labels: map[string]string{"team": strconv.Itoa(i / 10)}},
			Spec: a2av1.AgentSpec{OrgID: fmt.Sprintf("org%d", i/1000), UnitID: fmt.Sprintf("unit%d", i%10),
				Card:    a2av1.AgentCardSpec{Name: "bench", Description: "benchmark agent"},
				Callers: a2av1.CallersSpec{Scope: []a2av1.CallerScope{a2av1.CallerScopeNone, a2av1.CallerScopeSameUnit, a2av1.CallerScopeSameOrg}[i%3]}},
		}
		if i%100 == 0 {
			a.Spec.Callers.From = []a2av1.CallerSelector{{AgentSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": strconv.Itoa(i/10 + 1)}}}}
		}
		if err := cp.Client.Create(ctx, a); err != nil {
			b.Fatal(err)
		}
		yes := true
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.CredentialsSecretName(a),
			Labels:          map[string]string{identity.LabelManagedBy: identity.ManagedByValue},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: a2av1.GroupVersion.String(), Kind: "Agent", Name: a.Name, UID: a.UID, Controller: &yes}}},
			Data: map[string][]byte{identity.SecretKeyPassword: []byte("pw-" + a.Name)}}
		if err := cp.Client.Create(ctx, sec); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d Agents and Secrets created in %v", n, time.Since(created).Round(time.Millisecond))

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	s, err := newService(ctx, cp.Config, options{probeAddr: "0", metricsAddr: "0"}, logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.store.Close() })
	start := time.Now()
	go func() { _ = s.mgr.Start(ctx) }()
	testenv.Eventually(b, 5*time.Minute, "the replica's first full pass", func() error {
		if clients, _, _ := s.store.Size(); !s.converger.Ready() || clients != n {
			return fmt.Errorf("ready %v, %d clients", s.converger.Ready(), clients)
		}
		return nil
	})
	ready, first := time.Since(start), time.Duration(s.converger.lastPass.Load())
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	var steady time.Duration
	passes := 0
	for b.Loop() {
		passes++
		done := s.converger.passes.Load()
		s.converger.trigger()
		testenv.Eventually(b, 10*time.Minute, "a pass", func() error {
			if s.converger.passes.Load() == done {
				return fmt.Errorf("no pass yet")
			}
			return nil
		})
		steady += time.Duration(s.converger.lastPass.Load())
	}
	steady /= time.Duration(passes)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	load, _ := os.ReadFile("/proc/loadavg")
	b.ReportMetric(first.Seconds()*1e3, "first-pass-ms")
	b.ReportMetric(steady.Seconds()*1e3, "pass-ms")
	b.ReportMetric(steady.Seconds()*1e6/float64(n), "pass-µs/agent")
	b.ReportMetric(heap/float64(n)/1024, "heap-KiB/agent")
	b.Logf("%d Agents: ready %v after start (first pass %v), a pass with nothing changed %v (%.0f µs per Agent), heap %.1f MiB (%.1f KiB per Agent: cache and table); load %s",
		n, ready.Round(time.Millisecond), first.Round(time.Millisecond), steady.Round(time.Millisecond), steady.Seconds()*1e6/float64(n), heap/(1<<20), heap/float64(n)/1024, string(load[:14]))
}
