package chaos

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
)

// rotationRounds is how many times both agents' credentials are rotated under load.
const rotationRounds = 3

// rotationWork keeps the agents busy on each request, so that some are executing whenever an old
// pod is told to stop.
const rotationWork = 300 * time.Millisecond

// Both agents' credentials are rotated (the annotation) rotationRounds times under a load whose
// requests take rotationWork each. The rotation is staged (docs/reliability.md): the new password
// goes into the Secret, the Deployment rolls (Recreate), the old pod drains (stops taking
// requests, finishes and answers the ones in flight, disconnects) and only then does the broker
// get the new password, which the new pod's retried CONNECT is waiting for. The bar: nothing lost,
// nothing executed twice; every old pod drained by itself within its grace period and was never
// disconnected by the broker; no new pod crashed.
func TestCredentialRotationUnderTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	agents := []string{"direct", "gated"}
	l := f.startLoadWith(4, rotationWork)
	started := time.Now()
	time.Sleep(3 * time.Second)
	var lastFault time.Time
	drained := 0 // requests that were executing when their pod was told to stop
	for round := 1; round <= rotationRounds; round++ {
		passwords, rollouts, oldPods := map[string]string{}, map[string]int{}, map[string][]*localcluster.Pod{}
		for _, name := range agents {
			_, passwords[name] = f.Credentials(ctx, chaosNS, name)
			rollouts[name], oldPods[name] = f.workloads[name].Rollouts(), f.workloads[name].Pods()
		}
		fault := time.Now()
		lastFault = fault
		for _, name := range agents {
			f.rotate(ctx, name, fmt.Sprintf("round-%d-%d", round, fault.UnixNano()))
		}
		var steps []string
		for _, name := range agents {
			f.waitFor(ctx, 2*time.Minute, name+": workload rolled", func() bool { return f.workloads[name].Rollouts() > rollouts[name] })
			rolled := time.Since(fault)
			f.waitFor(ctx, 3*time.Minute, name+": broker switched to the new password", func() bool {
				s := f.credentialsSecret(ctx, name)
				return string(s.Data["password"]) != passwords[name] && s.Annotations["a2a.fleet.dev/password-synced"] == "true"
			})
			steps = append(steps, fmt.Sprintf("%s: new pod started %.1fs, broker switched %.1fs", name, rolled.Seconds(), time.Since(fault).Seconds()))
		}
		f.waitServing(ctx, 2*time.Minute)
		t.Logf("round %d (after the rotation): %s; both agents answer %.1fs", round, strings.Join(steps, ", "), time.Since(fault).Seconds())
		for _, name := range agents {
			drained += f.checkDrained(name, oldPods[name])
			for _, p := range f.workloads[name].Pods() {
				if n := p.Restarts()["agent"]; n > 0 {
					t.Errorf("%s: new pod %s restarted %d times (its refused CONNECTs should have been retried, not fatal)", name, p.Name, n)
				}
			}
		}
		time.Sleep(3 * time.Second) // traffic between rounds
	}
	t.Logf("%d requests were executing on an old pod when it was told to stop, and were answered before it disconnected", drained)
	rep := l.stop(fmt.Sprintf("credential rotation ×%d of both agents under traffic (%s of work per request; %d executing at a SIGTERM)", rotationRounds, rotationWork, drained), started, lastFault)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// rotate asks for new credentials for an Agent (the annotation, to a new value).
func (f *fleet) rotate(ctx context.Context, name, value string) {
	f.t.Helper()
	a := &a2av1.Agent{}
	if err := f.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: name}, a); err != nil {
		f.t.Fatal(err)
	}
	patch := client.MergeFrom(a.DeepCopy())
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	a.Annotations["a2a.fleet.dev/rotate-credentials"] = value
	if err := f.Cluster.Client.Patch(ctx, a, patch); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) credentialsSecret(ctx context.Context, agent string) *corev1.Secret {
	f.t.Helper()
	s := &corev1.Secret{}
	if err := f.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: agent + "-mqtt-credentials"}, s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// waitFor polls cond until it holds and returns how long that took from the call.
func (f *fleet) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) time.Duration {
	f.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout || ctx.Err() != nil {
			f.t.Fatalf("%s: not after %s", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// drainStart is the chaos agent's log line when SIGTERM starts its drain.
var drainStart = regexp.MustCompile(`msg="chaos agent draining[^"]*" executing=([0-9]+)`)

// checkDrained: every old pod of a rolled workload ended by itself on SIGTERM (exit 0 within its
// grace period, after finishing its requests) and, once it was serving, was never disconnected
// by the broker (a password change disconnects the client with "administrative action") nor
// lost its connection. (A pod's first CONNECTs are refused while it waits for the broker to get
// its password: that is the staged rotation working.) It returns how many requests the pods
// were executing when they were told to stop.
func (f *fleet) checkDrained(name string, pods []*localcluster.Pod) int {
	f.t.Helper()
	executing := 0
	for _, p := range pods {
		terms := p.Terminations()
		if len(terms) == 0 {
			f.t.Errorf("%s: old pod %s was not deleted by the rollout", name, p.Name)
		}
		for _, term := range terms {
			if term.Killed || term.ExitCode != 0 {
				f.t.Errorf("%s: old pod %s did not drain by itself: %+v\n%s", name, p.Name, term, tail(p.Logs(), 2000))
			}
		}
		logs := p.Logs()
		_, serving, _ := strings.Cut(logs, "chaos agent serving")
		for _, bad := range []string{"administrative change", "connection lost", "refused the connection"} {
			if strings.Contains(serving, bad) {
				f.t.Errorf("%s: old pod %s: %q while it was serving, before its drain:\n%s", name, p.Name, bad, tail(logs, 3000))
			}
		}
		if !strings.Contains(serving, "chaos agent stopped cleanly") {
			f.t.Errorf("%s: old pod %s did not report a clean drain:\n%s", name, p.Name, tail(logs, 2000))
		}
		if m := drainStart.FindStringSubmatch(serving); m != nil {
			n, _ := strconv.Atoi(m[1])
			executing += n
		}
	}
	return executing
}
