package localcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DeploymentController stands for the Deployment and ReplicaSet controllers (and the kubelet)
// for one Deployment that something else creates (an Agent's workload, by the operator): it runs
// spec.replicas pods of the current template, rolls them when the template changes (the new pods
// ready first, then the old ones go), and writes the Deployment's status (replicas, ready,
// available, the Available condition) as kube-controller-manager would.
type DeploymentController struct {
	c         *Cluster
	namespace string
	name      string

	mu       sync.Mutex
	pods     []*Pod
	all      []*Pod
	hash     string
	rollouts int
	lastErr  error
	done     chan struct{}
}

// RunDeployment manages Deployment namespace/name until ctx ends or the Deployment is deleted
// (then its pods go too). The Deployment need not exist yet.
func (c *Cluster) RunDeployment(ctx context.Context, namespace, name string) *DeploymentController {
	d := &DeploymentController{c: c, namespace: namespace, name: name, done: make(chan struct{})}
	go d.loop(ctx)
	return d
}

// Pods are the current template's pods.
func (d *DeploymentController) Pods() []*Pod {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Pod(nil), d.pods...)
}

// AllPods are every pod the controller started (for their logs and volumes).
func (d *DeploymentController) AllPods() []*Pod {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Pod(nil), d.all...)
}

// Rollouts counts template changes rolled out (the first pods are not a rollout).
func (d *DeploymentController) Rollouts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rollouts
}

// Err is the last error that kept the controller from converging (nil when none).
func (d *DeploymentController) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastErr
}

func templateHash(t corev1.PodTemplateSpec) string {
	data, _ := json.Marshal(t)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func (d *DeploymentController) loop(ctx context.Context) {
	defer close(d.done)
	defer func() {
		for _, p := range d.Pods() {
			p.Delete()
		}
	}()
	for {
		err := d.sync(ctx)
		d.mu.Lock()
		d.lastErr = err
		d.mu.Unlock()
		if apierrors.IsNotFound(err) && d.hash != "" {
			return // deleted
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (d *DeploymentController) sync(ctx context.Context) error {
	dep := &appsv1.Deployment{}
	if err := d.c.Client.Get(ctx, client.ObjectKey{Namespace: d.namespace, Name: d.name}, dep); err != nil {
		return err
	}
	hash := templateHash(dep.Spec.Template)
	replicas := int(ptr.Deref(dep.Spec.Replicas, 1))
	d.mu.Lock()
	current, old := d.hash, d.pods
	d.mu.Unlock()
	if hash != current || len(old) != replicas {
		var fresh []*Pod
		for r := range replicas {
			p, err := d.c.StartPod(ctx, d.namespace, d.name, r)
			if err != nil {
				for _, p := range fresh {
					p.Delete()
				}
				return err
			}
			fresh = append(fresh, p)
		}
		for _, p := range fresh {
			if err := p.WaitReady(ctx, 2*time.Minute); err != nil {
				fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
			}
		}
		d.mu.Lock()
		d.pods, d.hash = fresh, hash
		d.all = append(d.all, fresh...)
		if current != "" && hash != current {
			d.rollouts++
		}
		d.mu.Unlock()
		for _, p := range old {
			p.Delete()
		}
	}
	return d.writeStatus(ctx, dep)
}

func (d *DeploymentController) writeStatus(ctx context.Context, dep *appsv1.Deployment) error {
	ready := 0
	for _, p := range d.Pods() {
		if p.Probe(ctx, true) == nil {
			ready++
		}
	}
	want := int32(ptr.Deref(dep.Spec.Replicas, 1))
	available := corev1.ConditionFalse
	if int32(ready) >= want {
		available = corev1.ConditionTrue
	}
	st := appsv1.DeploymentStatus{
		ObservedGeneration: dep.Generation, Replicas: want, UpdatedReplicas: want,
		ReadyReplicas: int32(ready), AvailableReplicas: int32(ready), UnavailableReplicas: max(want-int32(ready), 0),
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: available,
			Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if prev := dep.Status; prev.ObservedGeneration == st.ObservedGeneration && prev.ReadyReplicas == st.ReadyReplicas &&
		prev.AvailableReplicas == st.AvailableReplicas && len(prev.Conditions) == 1 && prev.Conditions[0].Status == available {
		return nil
	}
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Status = st
	return d.c.Client.Status().Patch(ctx, dep, patch)
}
