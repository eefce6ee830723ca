//go:build chaos_pending

// The scenarios in this file fail on main because fixes they depend on live on other branches
// (docs/reliability.md, "Pending scenarios"); `make test-chaos-pending` runs them. They are kept
// out of `make test` until those fixes are merged, and never skipped silently: once merged,
// remove the build constraint above.
package chaos

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
)

// The broker loses its whole state (a new, empty volume: no dynsec identities, no retained cards,
// no sessions) and starts again; its init container initialises dynsec with the admin of the
// Secret. The operator must notice and register every identity again (the agents', the
// service's, its own), republish the cards, and every client must come back without a restart.
func TestBrokerRestartWithEmptyState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	l := f.startLoad(3)
	started := time.Now()
	time.Sleep(3 * time.Second)

	old := f.Pods[installed.Broker][0]
	old.Delete()
	claim := f.Cluster.ClaimDir(installed.Namespace, "a2a-fleet-mosquitto-data")
	entries, err := os.ReadDir(claim)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(claim, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	fault := time.Now()
	broker, err := f.Cluster.StartPod(ctx, installed.Namespace, installed.Broker, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Pods[installed.Broker][0] = broker
	if err := broker.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker %s started on an empty volume (dynsec initialised again) %.1fs after the old one went", broker.Name, time.Since(fault).Seconds())
	f.waitServing(ctx, 2*time.Minute)
	t.Logf("both agents answer %.1fs after the broker lost its state", time.Since(fault).Seconds())
	time.Sleep(5 * time.Second) // traffic after the recovery counts too
	rep := l.stop("broker restart with empty state (new volume)", started, fault)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// Both agents' credentials are rotated (the annotation) under load: the operator writes new
// passwords and pushes them to the broker (which disconnects the old sessions), and the agents'
// Deployments must roll so that the pods start with the new Secret.
func TestCredentialRotationUnderTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	passwords := map[string]string{}
	for _, name := range []string{"direct", "gated"} {
		_, passwords[name] = f.Credentials(ctx, chaosNS, name)
	}
	l := f.startLoad(3)
	started := time.Now()
	time.Sleep(3 * time.Second)
	fault := time.Now()
	for _, name := range []string{"direct", "gated"} {
		a := f.agent(ctx, name)
		patch := client.MergeFrom(a.DeepCopy())
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations["a2a.fleet.dev/rotate-credentials"] = fault.Format(time.RFC3339Nano)
		if err := f.Cluster.Client.Patch(ctx, a, patch); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"direct", "gated"} {
		deadline := time.Now().Add(time.Minute)
		for {
			if _, pw := f.Credentials(ctx, chaosNS, name); pw != passwords[name] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: password not rotated after a minute", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for f.workloads[name].Rollouts() == 0 {
			if time.Since(fault) > 2*time.Minute {
				secret := &corev1.Secret{}
				_ = f.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: name + "-mqtt-credentials"}, secret)
				t.Fatalf("%s: the workload was not rolled %s after its credentials were rotated (pod template unchanged: its pods keep the old password and are locked out)", name, time.Since(fault).Round(time.Second))
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("%s: workload rolled %.1fs after the rotation", name, time.Since(fault).Seconds())
	}
	f.waitServing(ctx, 2*time.Minute)
	t.Logf("both agents answer %.1fs after the rotation", time.Since(fault).Seconds())
	time.Sleep(5 * time.Second) // traffic after the recovery counts too
	rep := l.stop("credential rotation of both agents under traffic", started, fault)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// The conversation service's /readyz fails while its broker connection has been down longer than
// its grace (10 s on the service branch) and recovers without a restart.
func TestServiceReadinessFollowsTheBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	broker := f.Pods[installed.Broker][0]
	svc := f.Pods[installed.Service][0]
	broker.StopContainer("mosquitto", syscall.SIGKILL)
	down := time.Now()
	if _, err := waitProbe(ctx, svc, false, 40*time.Second); err != nil {
		t.Fatalf("%s still ready %.1fs after the broker went: %v", svc.Name, time.Since(down).Seconds(), err)
	}
	t.Logf("%s unready %.1fs after the broker went", svc.Name, time.Since(down).Seconds())
	if err := broker.StartContainer(ctx, "mosquitto"); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	if _, err := waitProbe(ctx, svc, true, time.Minute); err != nil {
		t.Fatalf("%s not ready again %.1fs after the broker came back: %v", svc.Name, time.Since(up).Seconds(), err)
	}
	t.Logf("%s ready again %.1fs after the broker came back", svc.Name, time.Since(up).Seconds())
	f.checkNoFrozenProcess(ctx)
}

// agent reads an Agent.
func (f *fleet) agent(ctx context.Context, name string) *a2av1.Agent {
	a := &a2av1.Agent{}
	if err := f.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: name}, a); err != nil {
		f.t.Fatal(err)
	}
	return a
}
