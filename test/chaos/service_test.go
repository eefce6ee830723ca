package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// killService is kill -9 of the container of a service replica under load (the kubelet restarts
// it in the same pod: same state volume), twice, with conversations waiting in input-required
// that must complete after the restart.
func killService(ctx context.Context, t *testing.T, f *fleet, name string, replicas int) {
	t.Helper()
	if n := len(pods(ctx, t, cluster.Namespace, servicePods)); n != replicas {
		t.Fatalf("%d service replicas, want %d", n, replicas)
	}
	l := f.startLoad(4)
	started := time.Now()
	time.Sleep(3 * time.Second)
	for round := range 2 {
		convs := openConversations(ctx, t, f, 5)
		time.Sleep(2 * time.Second)
		svc := pods(ctx, t, cluster.Namespace, servicePods)[0]
		fault := time.Now()
		f.kill(ctx, &svc, "conversation-service")
		restarted := time.Since(fault)
		if err := cluster.Poll(ctx, 2*time.Minute, svc.Name+" ready", func(ctx context.Context) (bool, string, error) {
			ready, err := env.Pods(ctx, cluster.Namespace, servicePods)
			for _, p := range ready {
				if p.Name == svc.Name {
					return true, "", err
				}
			}
			return false, "", err
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: replica %s restarted %.1fs and ready %.1fs after kill -9", round+1, svc.Name, restarted.Seconds(), time.Since(fault).Seconds())
		resume(ctx, t, f, convs)
		time.Sleep(3 * time.Second)
	}
	rep := l.stop(ctx, name, started)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// One replica on bbolt (the quickstart): its state file on the pod's volume survives the kill.
func TestServiceKilledUnderLoadBbolt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstartInstall)
	killService(ctx, t, f, "service kill -9 ×2 (bbolt, 1 replica)", 1)
}

// Two replicas on Redis (the quickstart scaled out as docs/conversation-service.md says: a Redis,
// --store=redis://..., replicas 2): one replica is killed; the other and the restarted one share
// the state.
func TestServiceKilledUnderLoadRedis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, redisInstall)
	killService(ctx, t, f, "service kill -9 ×2 (Redis, 2 replicas)", 2)
}
