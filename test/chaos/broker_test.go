package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// openConversation starts a two-turn task on the gated agent and leaves it in input-required.
type openConversation struct{ task, contextID, first string }

func openConversations(ctx context.Context, t *testing.T, f *fleet, n int) []openConversation {
	t.Helper()
	var out []openConversation
	for range n {
		c := openConversation{task: uuid.NewString(), contextID: uuid.NewString(), first: uuid.NewString()[:8]}
		res, err := sendOnce(ctx, f.requester, "gated", c.task, c.contextID, "ask:"+c.first)
		if err != nil || stateOf(res) != a2a.TaskStateInputRequired {
			t.Fatalf("open conversation: %v (state %s)", err, stateOf(res))
		}
		out = append(out, c)
	}
	return out
}

// resume answers every open conversation and expects each task to complete with both turns.
func resume(ctx context.Context, t *testing.T, f *fleet, convs []openConversation) {
	t.Helper()
	for i, c := range convs {
		cctx, cancel := context.WithTimeout(ctx, callDeadline)
		res, err := sendOnce(cctx, f.requester, "gated", c.task, c.contextID, "resumed")
		cancel()
		if want := c.first + "+resumed"; err != nil || a2amqtt.ResultText(res) != want {
			t.Errorf("conversation %d (task %s) not resumed after the fault: %v, got %q want %q", i, c.task, err, a2amqtt.ResultText(res), want)
		}
	}
}

// brokerFaults are the ways the broker goes down in TestBrokerRestartMidConversation, each a
// restart with its state on the volume.
var brokerFaults = []struct {
	name string
	do   func(ctx context.Context, f *fleet, broker *corev1.Pod)
}{
	{"pod deleted (SIGTERM; a new pod on the same volume)", func(ctx context.Context, f *fleet, broker *corev1.Pod) {
		f.deletePod(ctx, broker, nil)
	}},
	{"kill -9 (the kubelet restarts the container in the same pod)", func(ctx context.Context, f *fleet, broker *corev1.Pod) {
		f.kill(ctx, broker, "mosquitto")
	}},
	{"pod force-deleted (grace 0; a new pod on the same volume)", func(ctx context.Context, f *fleet, broker *corev1.Pod) {
		f.deletePod(ctx, broker, new(int64))
	}},
}

// deletePod deletes a pod (with its own grace period when grace is nil) and waits until it is
// gone and its Deployment has another one ready.
func (f *fleet) deletePod(ctx context.Context, pod *corev1.Pod, grace *int64) {
	f.t.Helper()
	if err := env.Clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: grace}); err != nil {
		f.t.Fatal(err)
	}
	err := cluster.Poll(ctx, 2*time.Minute, "pod "+pod.Name+" gone", func(ctx context.Context) (bool, string, error) {
		p, err := env.Clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID) {
			return true, "", nil
		}
		return false, "terminating", err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// The broker restarts three times under load (its pod deleted, a kill -9 of the process, its pod
// force-deleted; persistence and dynsec state on its volume), each time with conversations waiting
// in input-required; they are answered after the restart and must complete.
func TestBrokerRestartMidConversation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstartInstall)
	l := f.startLoad(4)
	started := time.Now()
	for round, fault := range brokerFaults {
		convs := openConversations(ctx, t, f, 5)
		time.Sleep(2 * time.Second)
		broker := readyPod(ctx, t, cluster.Namespace, brokerPods, time.Minute)
		at := time.Now()
		fault.do(ctx, f, broker)
		back := readyPod(ctx, t, cluster.Namespace, brokerPods, 2*time.Minute)
		t.Logf("round %d (%s): broker %s ready %.1fs after the fault", round+1, fault.name, back.Name, time.Since(at).Seconds())
		f.waitServing(ctx, 2*time.Minute)
		t.Logf("round %d: both agents answer %.1fs after the fault", round+1, time.Since(at).Seconds())
		resume(ctx, t, f, convs)
		time.Sleep(3 * time.Second)
	}
	rep := l.stop(ctx, "broker restart ×3 (pod deleted, kill -9, pod force-deleted) mid-conversation", started)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// The broker loses its whole state (a new, empty volume: no dynsec identities, no retained cards,
// no sessions) and starts again; its init container initialises dynsec with the admin of the
// Secret. The operator notices (its state-loss sentinel, at the admin reconnect), says so in the
// Agents' status (ACLsSynced and Ready False), registers every identity again (the agents'
// clients and roles, the shared unit/org/gate roles and groups, the service's and its own),
// republishes the cards, and every client comes back without a restart.
func TestBrokerRestartWithEmptyState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := newFleet(ctx, t, quickstartInstall)
	before, err := f.brokerState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conditions := f.watchConditions(ctx)
	l := f.startLoad(4)
	started := time.Now()
	time.Sleep(3 * time.Second)

	// The volume is lost: the broker scaled to 0, its claim deleted (the provisioner deletes the
	// folder) and created again (a new, empty folder), the broker scaled up again.
	down := f.brokerDown(ctx)
	claim := &corev1.PersistentVolumeClaim{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: brokerClaim}, claim); err != nil {
		t.Fatal(err)
	}
	oldVolume := claim.Spec.VolumeName
	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	newClaim := func() *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: claim.Name, Labels: claim.Labels}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: claim.Spec.AccessModes, Resources: claim.Spec.Resources, StorageClassName: claim.Spec.StorageClassName, VolumeMode: claim.Spec.VolumeMode,
		}}
	}
	fresh := newClaim()
	t.Cleanup(func() { // a scenario that fails before the new claim leaves the broker one
		if err := env.Client.Create(context.Background(), newClaim()); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Errorf("create the broker's claim again: %v", err)
		}
	})
	err = cluster.Poll(ctx, 2*time.Minute, "claim "+brokerClaim+" and its volume gone", func(ctx context.Context) (bool, string, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
			return false, "claim still there", client.IgnoreNotFound(err)
		}
		err := env.Client.Get(ctx, client.ObjectKey{Name: oldVolume}, &corev1.PersistentVolume{})
		return apierrors.IsNotFound(err), "volume " + oldVolume + " still there", client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	fault := time.Now()
	f.scaleBroker(ctx, 1)
	broker := readyPod(ctx, t, cluster.Namespace, brokerPods, 2*time.Minute)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(fresh), fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.Spec.VolumeName == oldVolume || fresh.Spec.VolumeName == "" {
		t.Fatalf("the broker's claim is bound to %q, not to a new volume (old %s)", fresh.Spec.VolumeName, oldVolume)
	}
	t.Logf("broker %s ready on a new, empty volume %s (dynsec initialised again) %.1fs after the old one went down, %.1fs after the new claim",
		broker.Name, fresh.Spec.VolumeName, time.Since(down).Seconds(), time.Since(fault).Seconds())
	f.waitServing(ctx, 2*time.Minute)
	t.Logf("both agents answer %.1fs after the new claim", time.Since(fault).Seconds())

	// Everything the operator had put on the broker is back, identically (clients with their
	// roles and groups, every role's ACLs, the shared groups' members).
	var missing []string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		after, err := f.brokerState(ctx)
		if err == nil {
			if missing = missingFrom(before, after); len(missing) == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker state not restored 2 minutes after the loss (%v): %d of %d entries differ:\n%s", err, len(missing), len(before), strings.Join(missing, "\n"))
		}
	}
	t.Logf("all %d dynsec clients, groups and roles back %.1fs after the new claim", len(before), time.Since(fault).Seconds())
	if _, err := env.WaitAgents(ctx, chaosNS, 2*time.Minute, false, append([]string{"client"}, workloads...)...); err != nil {
		t.Fatal(err)
	}
	conditions.checkFlipped(t, fault, "client", "direct", "gated")

	time.Sleep(5 * time.Second) // traffic after the recovery counts too
	rep := l.stop(ctx, "broker restart with empty state (a new volume)", started)
	rep.check(t)
	f.checkNoFrozenProcess(ctx)
}

// scaleBroker scales the broker's Deployment and waits until it has that many ready pods and no
// other.
func (f *fleet) scaleBroker(ctx context.Context, replicas int32) {
	f.t.Helper()
	if err := env.Scale(ctx, cluster.Namespace, brokerDeployment, replicas); err != nil {
		f.t.Fatal(err)
	}
	err := cluster.Poll(ctx, 2*time.Minute, fmt.Sprintf("broker scaled to %d ready pods", replicas), func(ctx context.Context) (bool, string, error) {
		all, err := env.Clientset.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: brokerPods})
		if err != nil {
			return false, "", err
		}
		ready, err := env.Pods(ctx, cluster.Namespace, brokerPods)
		if err != nil {
			return false, "", err
		}
		return len(all.Items) == int(replicas) && len(ready) == int(replicas), fmt.Sprintf("%d pods, %d ready", len(all.Items), len(ready)), nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}
