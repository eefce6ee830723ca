package chaos

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// killService is kill -9 of the container of a service replica under load, with conversations
// waiting in input-required that must complete after the restart.
func killService(ctx context.Context, t *testing.T, f *fleet, name string, replica int) {
	t.Helper()
	svc := f.Pods[installed.Service][replica]
	l := f.startLoad(4)
	started := time.Now()
	time.Sleep(3 * time.Second)
	var lastFault time.Time
	for round := range 2 {
		convs := openConversations(ctx, t, f, 5)
		time.Sleep(2 * time.Second)
		lastFault = time.Now()
		// The kubelet starts the container again at once, in the same pod (same state volume).
		if err := svc.KillContainer(ctx, "conversation-service"); err != nil {
			t.Fatal(err)
		}
		if err := svc.WaitReady(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: replica %s ready %.1fs after kill -9", round+1, svc.Name, time.Since(lastFault).Seconds())
		resume(ctx, t, f, convs)
		time.Sleep(3 * time.Second)
	}
	rep := l.stop(name, started, lastFault)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// One replica on bbolt (the quickstart): its state file on the pod's volume survives the kill.
func TestServiceKilledUnderLoadBbolt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstart(t).objs)
	killService(ctx, t, f, "service kill -9 ×2 (bbolt, 1 replica)", 0)
}

// Two replicas on Redis (the quickstart scaled out as docs/conversation-service.md says: a Redis,
// --store=redis://..., replicas 2): one replica is killed; the other and the restarted one share
// the state.
func TestServiceKilledUnderLoadRedis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := redisOverlay(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := newFleetWith(ctx, t, objs, map[string]localcluster.Image{"redis": localcluster.RedisImage()})
	if n := len(f.Pods[installed.Service]); n != 2 {
		t.Fatalf("%d service replicas, want 2", n)
	}
	killService(ctx, t, f, "service kill -9 ×2 (Redis, 2 replicas)", 0)
}

// redisOverlay is a user's overlay of config/quickstart that scales the service out on Redis.
func redisOverlay(root, dir string) ([]*unstructured.Unstructured, error) {
	files := map[string]string{
		"redis.yaml": `apiVersion: apps/v1
kind: Deployment
metadata: {name: a2a-fleet-redis, namespace: a2a-fleet-system, labels: {app.kubernetes.io/name: redis}}
spec:
  replicas: 1
  selector: {matchLabels: {app.kubernetes.io/name: redis}}
  template:
    metadata: {labels: {app.kubernetes.io/name: redis}}
    spec:
      automountServiceAccountToken: false
      containers:
      - name: redis
        image: redis:7.2
        args: ["--port", "6379", "--save", "", "--appendonly", "no"]
        ports: [{name: redis, containerPort: 6379}]
        readinessProbe: {tcpSocket: {port: redis}}
---
apiVersion: v1
kind: Service
metadata: {name: a2a-fleet-redis, namespace: a2a-fleet-system}
spec:
  selector: {app.kubernetes.io/name: redis}
  ports: [{name: redis, port: 6379, targetPort: redis}]
`,
		"service-redis.yaml": `apiVersion: apps/v1
kind: Deployment
metadata: {name: conversation-service, namespace: a2a-fleet-system}
spec:
  replicas: 2
  strategy: {type: RollingUpdate}
  template:
    spec:
      containers:
      - name: conversation-service
        args:
        - --broker=$(A2A_BROKER)
        - --store=redis://a2a-fleet-redis.a2a-fleet-system.svc:6379/0
        - --metrics-bind-address=:8080
        - --health-probe-bind-address=:8081
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	rel, err := filepath.Rel(dir, filepath.Join(root, "config", "quickstart"))
	if err != nil {
		return nil, err
	}
	k := "resources:\n- " + rel + "\n- redis.yaml\npatches:\n- path: service-redis.yaml\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	return render.Kustomize(root, dir)
}
