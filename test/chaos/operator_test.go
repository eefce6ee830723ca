package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// leader is the operator pod that holds the leader Lease: the one whose current process logged
// that it acquired it (the Lease's holder identity starts with the host name, which is this
// machine's for every pod here, not the pod's).
func (f *fleet) leader(ctx context.Context) *localcluster.Pod {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, p := range f.Pods[installed.Operator] {
			if proc := p.Proc("manager"); proc != nil && strings.Contains(proc.Output(), "Successfully acquired lease") {
				return p
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	lease := &coordinationv1.Lease{}
	_ = f.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: installed.Namespace, Name: "a2a-fleet-operator.a2a.fleet.dev"}, lease)
	f.t.Fatalf("no operator pod says it holds the lease (lease %+v)", lease.Spec)
	return nil
}

// A rollout of 100 new Agents is under way when the leading operator replica is killed with
// SIGKILL (the kubelet restarts it); the other replica takes the lease over and every Agent
// becomes Ready, while the load on the existing agents loses nothing.
func TestOperatorKilledDuringRollout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	l := f.startLoad(3)
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
	objs, err := render.Decode([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	leader := f.leader(ctx)
	if err := f.Cluster.Apply(ctx, objs, chaosNS); err != nil {
		t.Fatal(err)
	}
	// Kill as soon as the rollout is visibly under way (some Agents Ready, not all).
	readyCount := func() int {
		var list a2av1.AgentList
		if err := f.Cluster.Client.List(ctx, &list, client.InNamespace(chaosNS), client.MatchingLabels{"rollout": "yes"}); err != nil {
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
	deadline := time.Now().Add(time.Minute)
	for readyCount() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	before := readyCount()
	killed := time.Now()
	if err := leader.KillContainer(ctx, "manager"); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the leader %s with %d/%d Agents of the rollout Ready", leader.Name, before, n)
	for readyCount() < n {
		if time.Since(killed) > 3*time.Minute {
			t.Fatalf("only %d/%d Agents Ready %s after the leader was killed", readyCount(), n, time.Since(killed).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	converged := time.Since(killed)
	newLeader := f.leader(ctx)
	t.Logf("all %d Agents Ready %.1fs after kill -9 of the leader; leader now %s", n, converged.Seconds(), newLeader.Name)
	rep := l.stop(fmt.Sprintf("operator kill -9 during a rollout of %d Agents (%d Ready at the kill; all Ready %.1fs later)", n, before, converged.Seconds()), started, killed)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}
