package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// readinessGrace is the operator's --broker-readiness-grace default; serviceReadinessGrace the
// conversation service's --readiness-grace default.
const (
	readinessGrace        = 30 * time.Second
	serviceReadinessGrace = 10 * time.Second
)

// probe asks a pod's /readyz (through the API server's pod proxy) and returns whether it answered
// ready, not ready (its own 5xx: controller-runtime's healthz says 500, the service 503), or not
// at all (err: the pod unreachable, or no answer in time on a loaded machine).
func probe(ctx context.Context, pod *corev1.Pod) (ready bool, answer string, err error) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	code, body, err := env.PodGet(pctx, pod.Namespace, pod.Name, healthPort, "/readyz")
	if err != nil {
		return false, "", err
	}
	if code != 200 && code < 500 {
		return false, "", fmt.Errorf("/readyz of %s: %d %s", pod.Name, code, body)
	}
	return code == 200, fmt.Sprintf("%d %s", code, body), nil
}

// waitProbe polls a pod's /readyz until it answers want (true: ready).
func waitProbe(ctx context.Context, pod *corev1.Pod, want bool, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		ready, answer, err := probe(ctx, pod)
		if err == nil && ready == want {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("still %q (%v) after %s", answer, err, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// brokerDown scales the broker to 0 and returns when it was asked to (its process stops at once on
// SIGTERM); brokerUp scales it back and returns when its pod was ready.
func (f *fleet) brokerDown(ctx context.Context) time.Time {
	f.t.Helper()
	// A scenario that fails while the broker is down leaves it as it found it.
	f.t.Cleanup(func() {
		if err := env.Scale(context.Background(), cluster.Namespace, brokerDeployment, 1); err != nil {
			f.t.Errorf("scale the broker up again: %v", err)
		}
	})
	down := time.Now()
	f.scaleBroker(ctx, 0)
	f.t.Logf("broker pod gone %.1fs after the scale-down", time.Since(down).Seconds())
	return down
}

func (f *fleet) brokerUp(ctx context.Context) time.Time {
	f.t.Helper()
	start := time.Now()
	f.scaleBroker(ctx, 1)
	f.t.Logf("broker pod ready %.1fs after the scale-up", time.Since(start).Seconds())
	return time.Now()
}

// The leading operator's /readyz says the truth about the broker: it stays ready through a short
// broker outage (within the grace period), fails once the broker has been gone longer than the
// grace, and is ready again soon after the broker is back, without a restart. (The leader is the
// replica with broker connections; a follower's readiness is logged, not asserted.)
func TestOperatorReadinessFollowsTheBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstartInstall)
	leader, _ := f.leader(ctx, "")
	defer func() {
		for _, p := range pods(ctx, t, cluster.Namespace, operatorPods) {
			if p.Name != leader.Name {
				ready, answer, err := probe(ctx, &p)
				t.Logf("follower %s at the end: ready %v (%q, %v)", p.Name, ready, answer, err)
			}
		}
	}()

	down := f.brokerDown(ctx)
	// Ready through a broker restart's worth of downtime (well within the grace)...
	for time.Since(down) < readinessGrace-10*time.Second {
		if ready, answer, err := probe(ctx, leader); err == nil && !ready && time.Since(down) < readinessGrace-10*time.Second {
			t.Errorf("%s unready %.1fs after the broker went, within the %s grace: %s", leader.Name, time.Since(down).Seconds(), readinessGrace, answer)
			break
		}
		time.Sleep(time.Second)
	}
	// ...then unready.
	if _, err := waitProbe(ctx, leader, false, readinessGrace+30*time.Second); err != nil {
		t.Fatalf("%s still ready %.1fs after the broker went: %v", leader.Name, time.Since(down).Seconds(), err)
	}
	t.Logf("%s unready %.1fs after the broker went (grace %s)", leader.Name, time.Since(down).Seconds(), readinessGrace)
	up := f.brokerUp(ctx)
	if _, err := waitProbe(ctx, leader, true, time.Minute); err != nil {
		t.Fatalf("%s not ready again %.1fs after the broker came back: %v", leader.Name, time.Since(up).Seconds(), err)
	}
	t.Logf("%s ready again %.1fs after the broker pod was ready", leader.Name, time.Since(up).Seconds())
	f.checkNoFrozenProcess(ctx)
}

// The conversation service's /readyz fails while its broker connection has been down longer than
// its grace (--readiness-grace, 10 s), not before, and recovers without a restart.
func TestServiceReadinessFollowsTheBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstartInstall)
	svc := readyPod(ctx, t, cluster.Namespace, servicePods, time.Minute)
	down := f.brokerDown(ctx)
	if _, err := waitProbe(ctx, svc, false, 40*time.Second); err != nil {
		t.Fatalf("%s still ready %.1fs after the broker went: %v", svc.Name, time.Since(down).Seconds(), err)
	}
	took := time.Since(down)
	t.Logf("%s unready %.1fs after the broker went (grace %s)", svc.Name, took.Seconds(), serviceReadinessGrace)
	if took < serviceReadinessGrace-time.Second {
		t.Errorf("%s unready %.1fs after the broker went, within its %s grace: a broker restart would flap it", svc.Name, took.Seconds(), serviceReadinessGrace)
	}
	up := f.brokerUp(ctx)
	if _, err := waitProbe(ctx, svc, true, time.Minute); err != nil {
		t.Fatalf("%s not ready again %.1fs after the broker came back: %v", svc.Name, time.Since(up).Seconds(), err)
	}
	t.Logf("%s ready again %.1fs after the broker pod was ready", svc.Name, time.Since(up).Seconds())
	f.checkNoFrozenProcess(ctx)
}
