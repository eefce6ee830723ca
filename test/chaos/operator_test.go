package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// leaderLease is the operator's leader election Lease (cmd/manager).
const leaderLease = "a2a-fleet-operator.a2a.fleet.dev"

// leader is the operator pod that holds the leader Lease, under a holder identity other than
// not (the identity of a leader that was killed; "" for any): the identity starts with the
// holder's host name, which is its pod's name.
func (f *fleet) leader(ctx context.Context, not string) (*corev1.Pod, string) {
	f.t.Helper()
	var leader *corev1.Pod
	holder := ""
	err := cluster.Poll(ctx, time.Minute, "an operator pod that holds the lease", func(ctx context.Context) (bool, string, error) {
		lease := &coordinationv1.Lease{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: leaderLease}, lease); err != nil {
			return false, err.Error(), nil
		}
		holder = ""
		if lease.Spec.HolderIdentity != nil {
			holder = *lease.Spec.HolderIdentity
		}
		if holder == "" || holder == not {
			return false, "holder " + holder, nil
		}
		for _, p := range pods(ctx, f.t, cluster.Namespace, operatorPods) {
			if strings.HasPrefix(holder, p.Name+"_") && p.DeletionTimestamp == nil {
				leader = &p
				return true, "", nil
			}
		}
		return false, "holder " + holder + " is no operator pod", nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return leader, holder
}

// A rollout of 100 new Agents is under way when the leading operator replica is killed with
// SIGKILL (the kubelet restarts its container); the other replica takes the lease over once it
// expires and every Agent becomes Ready, while the load on the existing agents loses nothing.
func TestOperatorKilledDuringRollout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstartInstall)
	l := f.startLoad(4)
	started := time.Now()
	time.Sleep(2 * time.Second)

	const n = 100
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: rollout-%02d, namespace: %s, labels: {rollout: "yes"}}
spec:
  orgID: %s
  unitID: rollout
  card: {name: rollout-%02d, description: chaos rollout}
  callers: {scope: SameUnit}
---
`, i, chaosNS, chaosOrg, i)
	}
	file := filepath.Join(t.TempDir(), "rollout.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// The rollout's Agents go when the scenario ends, whatever happened (the fleet is kept).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := env.KubectlRun(ctx, "delete", "-f", file, "--ignore-not-found", "--wait=true", "--timeout=2m"); err != nil {
			t.Errorf("delete the rollout's Agents: %v", err)
		}
	})
	leader, identity := f.leader(ctx, "")
	// Kill as soon as the rollout is visibly under way (some Agents Ready, not all): the first
	// Ready one seen by a watch, while kubectl still creates the others.
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &a2av1.AgentList{}, client.InNamespace(chaosNS), client.MatchingLabels{"rollout": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	go func() {
		_, err := env.KubectlRun(ctx, "apply", "--server-side", "-f", file)
		applied <- err
	}()
	readyCount := func() int {
		var list a2av1.AgentList
		if err := env.Client.List(ctx, &list, client.InNamespace(chaosNS), client.MatchingLabels{"rollout": "yes"}); err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, a := range list.Items {
			if meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) {
				ready++
			}
		}
		return ready
	}
	firstReady := time.After(2 * time.Minute)
wait:
	for {
		select {
		case ev := <-w.ResultChan():
			if a, ok := ev.Object.(*a2av1.Agent); ok && meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) {
				break wait
			}
		case <-firstReady:
			t.Fatal("no Agent of the rollout Ready within 2 minutes")
		}
	}
	w.Stop()
	killed := time.Now()
	f.kill(ctx, leader, "manager")
	before := readyCount()
	t.Logf("killed the leader %s (kill -9; its container restarted %.1fs later, %d/%d Agents of the rollout Ready then)", leader.Name, time.Since(killed).Seconds(), before, n)
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	for readyCount() < n {
		if time.Since(killed) > 3*time.Minute {
			t.Fatalf("only %d/%d Agents Ready %s after the leader was killed", readyCount(), n, time.Since(killed).Round(time.Second))
		}
		time.Sleep(250 * time.Millisecond)
	}
	converged := time.Since(killed)
	newLeader, _ := f.leader(ctx, identity)
	t.Logf("all %d Agents Ready %.1fs after kill -9 of the leader; leader now %s", n, converged.Seconds(), newLeader.Name)
	rep := l.stop(ctx, fmt.Sprintf("operator kill -9 during a rollout of %d Agents (%d Ready at the kill; all Ready %.1fs later)", n, before, converged.Seconds()), started)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}
