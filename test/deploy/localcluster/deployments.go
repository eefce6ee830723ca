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
// spec.replicas pods of the current template, rolls them when the template changes by the
// Deployment's strategy (Recreate: the old pods are stopped, SIGTERM and their grace period, and
// only then do new ones start; RollingUpdate: the new pods ready first, then the old ones go),
// and writes the Deployment's status at each step of the rollout (observed generation, replicas,
// updated, ready and available replicas, the Available condition) as kube-controller-manager
// would: a terminating pod is not counted in replicas, and a new pod is counted as soon as it
// exists, ready or not.
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
		recreate := dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType
		if recreate && len(old) > 0 {
			// The old ReplicaSet is scaled to 0: its pods terminate (and no longer count) before
			// any new one starts.
			d.mu.Lock()
			d.pods = nil
			d.mu.Unlock()
			if err := d.writeStatus(ctx, dep, 0); err != nil {
				return err
			}
			d.deleteAll(old)
		}
		var fresh []*Pod
		for r := range replicas {
			p, err := d.c.StartPod(ctx, d.namespace, d.name, r)
			if err != nil {
				d.deleteAll(fresh)
				return err
			}
			fresh = append(fresh, p)
		}
		d.mu.Lock()
		d.all = append(d.all, fresh...)
		if current != "" && hash != current {
			d.rollouts++
		}
		if recreate {
			d.pods, d.hash = fresh, hash
		}
		d.mu.Unlock()
		if recreate {
			// The new pods count as soon as they exist, ready or not.
			if err := d.writeStatus(ctx, dep, len(fresh)); err != nil {
				return err
			}
		}
		for _, p := range fresh {
			if err := p.WaitReady(ctx, 2*time.Minute); err != nil {
				fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
			}
		}
		if !recreate {
			d.mu.Lock()
			d.pods, d.hash = fresh, hash
			d.mu.Unlock()
			d.deleteAll(old)
		}
	}
	return d.writeStatus(ctx, dep, len(d.Pods()))
}

// deleteAll deletes pods together (each SIGTERM, then SIGKILL after its grace period), as the
// kubelets of their nodes would, and returns when all are gone.
func (d *DeploymentController) deleteAll(pods []*Pod) {
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Delete()
		}()
	}
	wg.Wait()
}

// writeStatus writes the Deployment's status for the generation dep has, with running pods of its
// template (those not terminating; every current pod is of the current template here).
func (d *DeploymentController) writeStatus(ctx context.Context, dep *appsv1.Deployment, running int) error {
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
		ObservedGeneration: dep.Generation, Replicas: int32(running), UpdatedReplicas: int32(running),
		ReadyReplicas: int32(ready), AvailableReplicas: int32(ready), UnavailableReplicas: max(want-int32(ready), 0),
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: available,
			Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if prev := dep.Status; prev.ObservedGeneration == st.ObservedGeneration && prev.Replicas == st.Replicas && prev.UpdatedReplicas == st.UpdatedReplicas &&
		prev.ReadyReplicas == st.ReadyReplicas && prev.AvailableReplicas == st.AvailableReplicas && len(prev.Conditions) == 1 && prev.Conditions[0].Status == available {
		return nil
	}
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Status = st
	return d.c.Client.Status().Patch(ctx, dep, patch)
}
