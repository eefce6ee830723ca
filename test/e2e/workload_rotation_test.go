package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestRotationUnderLoadWithAWorkload, on both brokers: the same load and rotations as
// TestRotationUnderLoad, for two agents that run as workloads. The suite runs
// kube-controller-manager with the Deployment and ReplicaSet controllers, so the operator's
// Deployments roll for real (Recreate); what no process here does is a kubelet's part, which
// podRunner plays for the Agents' pods only: it runs each pod as an SDK responder reading the
// pod's credentials folder (the Secret at the time the pod started, then kept up to date as a
// Secret volume is), reports it Running and Ready, and on deletion drains it (stop taking
// requests, finish and answer those in flight, disconnect) before it removes the pod. The
// rotation is the staged one (docs/registration.md): the new password goes into the Secret, the
// Deployment rolls, the old pod drains and goes, and only then does the broker get the new
// password, which the new pod's refused CONNECTs are waiting for.
func TestRotationUnderLoadWithAWorkload(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind)
		st.startService(t, ctx, &clock{}, "r1")
		exec := &countingExec{runs: map[string]int{}}
		runner := startPodRunner(t, ctx, st, exec)
		for _, name := range []string{"direct", "memory"} {
			a := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: name}, a); err != nil {
				t.Fatal(err)
			}
			patch := client.MergeFrom(a.DeepCopy())
			grace := int64(10)
			a.Spec.Workload = &a2av1.AgentWorkload{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers:                    []corev1.Container{{Name: "agent", Image: "example/agent:1"}},
			}}}
			if err := k8s.Patch(ctx, a, patch); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"direct", "memory"} {
			waitConnected(t, ctx, st.ns, name, metav1.ConditionTrue, a2av1.ReasonConnected, time.Minute)
		}
		r := st.requester(t, ctx)
		load := startLoad(ctx, r, []a2amqtt.AgentRef{ref("direct"), ref("memory")}, 4)
		time.Sleep(2 * time.Second)

		var rotations []time.Time
		for round := 1; round <= 3; round++ {
			rotations = append(rotations, time.Now())
			value := fmt.Sprintf("round-%d", round)
			for _, name := range []string{"direct", "memory"} {
				rotate(t, ctx, st.ns, name, value)
			}
			for _, name := range []string{"direct", "memory"} {
				eventually(t, 2*time.Minute, name+": the broker got the rolled password", func() error {
					s := &corev1.Secret{}
					if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: name + "-mqtt-credentials"}, s); err != nil {
						return err
					}
					if s.Annotations["a2a.fleet.dev/rotated-for"] != value || s.Annotations["a2a.fleet.dev/password-synced"] != "true" {
						return fmt.Errorf("annotations %v", s.Annotations)
					}
					return nil
				})
			}
			time.Sleep(4 * time.Second)
		}
		rep := load.stop()
		windows := rep.errorWindows(rotations, 500*time.Millisecond)
		t.Logf("%s: rotation ×3 of both workloads under load: %s; error windows per rotation %v; pods run %d, drained %d",
			kind, rep, windows, runner.started.Load(), runner.drained.Load())
		if rep.lost > 0 || rep.mismatched > 0 {
			t.Errorf("lost %d, mismatched %d: want 0; lost: %v", rep.lost, rep.mismatched, rep.lostDetails(exec, rotations))
		}
		if d := exec.duplicates(); d > 0 {
			t.Errorf("%d requests executed more than once", d)
		}
		if runner.drained.Load() < 6 {
			t.Errorf("%d pods drained, want every old pod of 3 rotations × 2 agents", runner.drained.Load())
		}
		for i, w := range windows {
			if w > 5*time.Second {
				t.Errorf("rotation %d: errors for %s (want at most a few seconds)", i+1, w)
			}
		}
	})
}

// podRunner plays a kubelet for the Agents' pods of one namespace (see the test).
type podRunner struct {
	t                *testing.T
	st               *stack
	exec             *countingExec
	mu               sync.Mutex
	pods             map[string]*runningPod // by pod name
	started, drained atomicInt
}

type atomicInt struct {
	mu sync.Mutex
	n  int64
}

func (a *atomicInt) Add(d int64) { a.mu.Lock(); a.n += d; a.mu.Unlock() }
func (a *atomicInt) Load() int64 { a.mu.Lock(); defer a.mu.Unlock(); return a.n }

type runningPod struct {
	conn      *a2amqtt.Conn
	responder *a2amqtt.Responder
	stop      context.CancelFunc
	draining  bool
}

// runnerNode is the Node the pod runner binds the pods it runs to: a pod bound to a node is
// deleted gracefully (deletionTimestamp, then the kubelet removes it), an unbound one at once.
const runnerNode = "e2e-pod-runner"

func startPodRunner(t *testing.T, ctx context.Context, st *stack, exec *countingExec) *podRunner {
	r := &podRunner{t: t, st: st, exec: exec, pods: map[string]*runningPod{}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: runnerNode}}
	if err := k8s.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			r.sync(ctx)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, p := range r.pods {
			p.stop()
			_ = p.conn.Close(context.Background())
		}
	})
	return r
}

func (r *podRunner) sync(ctx context.Context) {
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(r.st.ns), client.HasLabels{identity.LabelAgent}); err != nil {
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		r.mu.Lock()
		running := r.pods[p.Name]
		r.mu.Unlock()
		switch {
		case p.DeletionTimestamp != nil && running != nil && !running.draining:
			r.t.Logf("pod runner: %s deleted: draining", p.Name)
			running.draining = true
			go r.drain(ctx, p.DeepCopy(), running)
		case p.DeletionTimestamp != nil && running == nil:
			r.remove(ctx, p)
		case p.DeletionTimestamp == nil && running == nil:
			if err := r.run(ctx, p); err != nil && ctx.Err() == nil {
				r.t.Logf("pod runner: run %s: %v", p.Name, err)
			}
		}
	}
}

// run starts the pod's agent with the credentials folder its Secret volume would hold, and
// reports the pod Running and Ready once it is connected.
func (r *podRunner) run(ctx context.Context, p *corev1.Pod) error {
	if p.Spec.NodeName == "" {
		// A scheduler's part: bind it, so that its deletion waits for this runner to stop it.
		if err := k8s.SubResource("binding").Create(ctx, p, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
			Target: corev1.ObjectReference{Kind: "Node", Name: runnerNode}}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
	}
	agent := p.Labels[identity.LabelAgent]
	a := &a2av1.Agent{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: agent}, a); err != nil {
		return err
	}
	topic := ""
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == "A2A_REQUEST_TOPIC" {
			topic = e.Value
		}
	}
	dir := r.t.TempDir()
	pctx, stop := context.WithCancel(ctx)
	keepCredentials(r.t, pctx, p.Namespace, agent, dir)
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: r.st.brokerURL, Agent: identity.Of(a), Credentials: a2amqtt.CredentialsDir(dir),
		Logger: quietLogger(), ConnectTimeout: 2 * time.Minute})
	if err != nil {
		stop()
		return err
	}
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: r.exec, RequestTopic: topic})
	if err != nil {
		stop()
		_ = conn.Close(ctx)
		return err
	}
	r.mu.Lock()
	r.pods[p.Name] = &runningPod{conn: conn, responder: resp, stop: stop}
	r.mu.Unlock()
	r.started.Add(1)
	r.t.Logf("pod runner: %s running", p.Name)
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", Ready: true, Started: ptrTo(true), Image: p.Spec.Containers[0].Image,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	return k8s.Status().Update(ctx, p)
}

// drain stops the pod's agent gracefully within the pod's grace period, then removes the pod.
func (r *podRunner) drain(ctx context.Context, p *corev1.Pod, running *runningPod) {
	grace := 30 * time.Second
	if p.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, grace)
	_ = running.responder.Shutdown(dctx)
	cancel()
	_ = running.conn.Close(ctx)
	running.stop()
	r.drained.Add(1)
	r.remove(ctx, p)
	r.mu.Lock()
	delete(r.pods, p.Name)
	r.mu.Unlock()
}

func (r *podRunner) remove(ctx context.Context, p *corev1.Pod) {
	if err := k8s.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		r.t.Logf("pod runner: remove %s: %v", p.Name, err)
	}
}

func ptrTo[T any](v T) *T { return &v }
