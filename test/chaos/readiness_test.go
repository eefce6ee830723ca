package chaos

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
)

// readinessGrace is the operator's --broker-readiness-grace default; serviceReadinessGrace the
// conversation service's --readiness-grace default.
const (
	readinessGrace        = 30 * time.Second
	serviceReadinessGrace = 10 * time.Second
)

// notReadyAnswer is a probe error that is the endpoint's answer (controller-runtime's healthz
// says 500, the service 503), as opposed to no answer in time on a loaded machine.
var notReadyAnswer = regexp.MustCompile(`GET \S+: 5[0-9][0-9]`)

func unready(err error) bool { return err != nil && notReadyAnswer.MatchString(err.Error()) }

// waitProbe polls a pod's readiness probe until it reports want (true: ready).
func waitProbe(ctx context.Context, p *localcluster.Pod, want bool, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		err := p.Probe(ctx, true)
		if (want && err == nil) || (!want && unready(err)) {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			if err == nil {
				err = errors.New("ready")
			}
			return time.Since(start), fmt.Errorf("still %v after %s", err, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// The leading operator's /readyz says the truth about the broker: it stays ready through a short
// broker restart (within the grace period), fails once the broker has been gone longer than the
// grace, and is ready again soon after the broker is back, without a restart. (The leader is
// the replica with broker connections; a follower's readiness is logged, not asserted.)
func TestOperatorReadinessFollowsTheBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	broker := f.Pods[installed.Broker][0]
	leader := f.leader(ctx)
	operators := []*localcluster.Pod{leader}
	defer func() {
		for _, p := range f.Pods[installed.Operator] {
			if p != leader {
				t.Logf("follower %s at the end: readiness %v", p.Name, p.Probe(ctx, true))
			}
		}
	}()

	broker.StopContainer("mosquitto", syscall.SIGKILL)
	down := time.Now()
	// Ready through a broker restart's worth of downtime (well within the grace)...
	for failed := false; !failed && time.Since(down) < readinessGrace-10*time.Second; time.Sleep(time.Second) {
		for _, p := range operators {
			if err := p.Probe(ctx, true); unready(err) && time.Since(down) < readinessGrace-10*time.Second {
				t.Errorf("%s unready %.1fs after the broker went, within the %s grace: %v", p.Name, time.Since(down).Seconds(), readinessGrace, err)
				failed = true
			}
		}
	}
	for _, p := range operators {
		// ...then unready.
		if _, err := waitProbe(ctx, p, false, readinessGrace+30*time.Second); err != nil {
			t.Fatalf("%s still ready %.1fs after the broker went: %v", p.Name, time.Since(down).Seconds(), err)
		}
		t.Logf("%s unready %.1fs after the broker went (grace %s)", p.Name, time.Since(down).Seconds(), readinessGrace)
	}
	if err := broker.StartContainer(ctx, "mosquitto"); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	for _, p := range operators {
		if _, err := waitProbe(ctx, p, true, time.Minute); err != nil {
			t.Fatalf("%s not ready again %.1fs after the broker came back: %v", p.Name, time.Since(up).Seconds(), err)
		}
		t.Logf("%s ready again %.1fs after the broker came back", p.Name, time.Since(up).Seconds())
	}
	f.checkNoFrozenProcess(ctx)
}

// The conversation service's /readyz fails while its broker connection has been down longer than
// its grace (--readiness-grace, 10 s), not before, and recovers without a restart.
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
	t.Logf("%s unready %.1fs after the broker went (grace %s)", svc.Name, time.Since(down).Seconds(), serviceReadinessGrace)
	if took := time.Since(down); took < serviceReadinessGrace-time.Second {
		t.Errorf("%s unready %.1fs after the broker went, within its %s grace: a broker restart would flap it", svc.Name, took.Seconds(), serviceReadinessGrace)
	}
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
