package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/test/cluster"
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
	f := newFleet(ctx, t, quickstartInstall)
	l := f.startLoadWith(4, rotationWork)
	started := time.Now()
	time.Sleep(3 * time.Second)
	drained := 0 // requests that were executing when their pod was told to stop
	for round := 1; round <= rotationRounds; round++ {
		passwords, oldPods := map[string]string{}, map[string][]corev1.Pod{}
		for _, name := range workloads {
			_, passwords[name] = credentials(ctx, t, name)
			oldPods[name] = pods(ctx, t, chaosNS, agentPods(name))
		}
		fault := time.Now()
		for _, name := range workloads {
			f.rotate(ctx, name, fmt.Sprintf("round-%d-%d", round, fault.UnixNano()))
		}
		var steps []string
		for _, name := range workloads {
			f.waitFor(ctx, 2*time.Minute, name+": workload rolled", func() bool {
				for _, p := range pods(ctx, t, chaosNS, agentPods(name)) {
					if !slices.ContainsFunc(oldPods[name], func(o corev1.Pod) bool { return o.UID == p.UID }) {
						return true
					}
				}
				return false
			})
			rolled := time.Since(fault)
			f.waitFor(ctx, 3*time.Minute, name+": broker switched to the new password", func() bool {
				s := f.credentialsSecret(ctx, name)
				return string(s.Data["password"]) != passwords[name] && s.Annotations["a2a.fleet.dev/password-synced"] == "true"
			})
			steps = append(steps, fmt.Sprintf("%s: new pod created %.1fs, broker switched %.1fs", name, rolled.Seconds(), time.Since(fault).Seconds()))
		}
		f.waitServing(ctx, 2*time.Minute)
		t.Logf("round %d (after the rotation): %s; both agents answer %.1fs", round, strings.Join(steps, ", "), time.Since(fault).Seconds())
		for _, name := range workloads {
			drained += f.checkDrained(ctx, name, oldPods[name], fault)
			for _, p := range pods(ctx, t, chaosNS, agentPods(name)) {
				if n := restartCount(&p, "agent"); n > 0 {
					t.Errorf("%s: new pod %s restarted %d times (its refused CONNECTs should have been retried, not fatal)", name, p.Name, n)
				}
			}
		}
		time.Sleep(3 * time.Second) // traffic between rounds
	}
	t.Logf("%d requests were executing on an old pod when it was told to stop, and were answered before it disconnected", drained)
	rep := l.stop(ctx, fmt.Sprintf("credential rotation ×%d of both agents under traffic (%s of work per request; %d executing at a SIGTERM)", rotationRounds, rotationWork, drained), started)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// rotate asks for new credentials for an Agent (the annotation, to a new value).
func (f *fleet) rotate(ctx context.Context, name, value string) {
	f.t.Helper()
	a := &a2av1.Agent{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: name}, a); err != nil {
		f.t.Fatal(err)
	}
	patch := client.MergeFrom(a.DeepCopy())
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	a.Annotations["a2a.fleet.dev/rotate-credentials"] = value
	if err := env.Client.Patch(ctx, a, patch); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) credentialsSecret(ctx context.Context, agent string) *corev1.Secret {
	f.t.Helper()
	s := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: agent + "-mqtt-credentials"}, s); err != nil {
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

// checkDrained: every old pod of a rolled workload is gone and ended by itself on SIGTERM (its log,
// kept on the workload's volume, ends with the clean stop, which it writes only after finishing
// its requests and disconnecting, before the exit 0: a pod killed at the end of its grace period
// never writes it) and, once it was serving, was never disconnected by the broker (a password
// change disconnects the client with "administrative action") nor lost its connection. (A pod's
// first CONNECTs are refused while it waits for the broker to get its password: that is the
// staged rotation working.) It returns how many requests the pods were executing when they were
// told to stop.
func (f *fleet) checkDrained(ctx context.Context, name string, old []corev1.Pod, since time.Time) int {
	f.t.Helper()
	executing := 0
	for _, p := range old {
		// Recreate starts the new pod once the old one stopped running; its object goes a moment
		// later, when the kubelet has finished with it.
		err := cluster.Poll(ctx, time.Minute, name+": old pod "+p.Name+" deleted by the rollout", func(ctx context.Context) (bool, string, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(&p), &corev1.Pod{})
			return apierrors.IsNotFound(err), "still there", client.IgnoreNotFound(err)
		})
		if err != nil {
			f.t.Error(err)
		}
		// The pod may have served through earlier scenarios' faults (the fleet is kept from one
		// scenario to the next): what counts is its log since it was still serving, before the
		// rotation (or since it started serving, when later).
		logs := f.podLog(ctx, name, p.Name)
		serving := logSince(logs, since)
		if _, after, ok := strings.Cut(serving, "chaos agent serving"); ok {
			serving = after
		}
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

// logSince is the part of a chaos agent's log (slog's text lines, "time=RFC3339 ...") written
// at or after since.
func logSince(logs string, since time.Time) string {
	for i := 0; i < len(logs); {
		line, _, _ := strings.Cut(logs[i:], "\n")
		stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if at, err := time.Parse(time.RFC3339Nano, stamp); err == nil && !at.Before(since) {
			return logs[i:]
		}
		i += len(line) + 1
	}
	return ""
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
