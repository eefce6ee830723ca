package controllers

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Workload reasons.
const (
	ReasonWorkloadAvailable   = "DeploymentAvailable"
	ReasonWorkloadProgressing = "DeploymentProgressing"
	ReasonWorkloadInvalid     = "InvalidWorkload"
)

// FieldManager is the server-side apply field manager of the operator's writes.
const FieldManager = "a2a-fleet-operator"

// WorkloadName is the name of the Deployment that runs an Agent's workload.
func WorkloadName(agent *a2av1.Agent) string { return agent.Name + "-agent" }

// appliedDeployments remembers, per Agent, the digest of the Deployment last applied and the
// generation the API server gave it, so that a reconcile with nothing new sends no request at
// all; a Deployment changed by someone else (new generation) is applied again.
type appliedDeployments struct {
	mu   sync.Mutex
	last map[types.UID]appliedDeployment
}

type appliedDeployment struct {
	digest     string
	generation int64
}

func (a *appliedDeployments) get(uid types.UID) (appliedDeployment, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.last[uid]
	return v, ok
}

func (a *appliedDeployments) set(uid types.UID, v appliedDeployment) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[types.UID]appliedDeployment{}
	}
	a.last[uid] = v
}

func (a *appliedDeployments) forget(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.last, uid)
}

// agentWorkload runs an Agent's spec.workload as a Deployment (server-side apply, Recreate) with
// the Agent's identity and credentials, within WorkloadPolicy, and reports WorkloadAvailable. It
// reads the Registered condition to say why no workload runs without credentials.
type agentWorkload struct {
	client    client.Client
	apiReader client.Reader
	policy    *WorkloadPolicy
	// brokerURL is the broker address injected into workloads (A2A_BROKER).
	brokerURL string
	// withCA: the credentials Secret carries the broker CA (identity.SecretKeyCA); the workload's
	// A2A_TLS_CA names its file in the mounted Secret.
	withCA      bool
	deployments appliedDeployments
}

// reconcile applies the Deployment of spec.workload with server-side apply (or deletes it when
// there is no workload, no credentials, or the workload is not permitted) and sets
// WorkloadAvailable from the Deployment's own status. checksum is the credentials' digest; ""
// means the Agent may run nothing.
func (u *agentWorkload) reconcile(ctx context.Context, view *tenancy.View, agent *a2av1.Agent, checksum string) error {
	key := client.ObjectKey{Namespace: agent.Namespace, Name: WorkloadName(agent)}
	if agent.Spec.Workload == nil || checksum == "" {
		if err := u.delete(ctx, agent, key); err != nil {
			return err
		}
		if agent.Spec.Workload == nil {
			removeCondition(agent, a2av1.ConditionWorkloadAvailable)
		} else {
			ready := conditionOf(agent, a2av1.ConditionRegistered)
			setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, ready.Reason,
				"no workload runs without the agent's credentials: "+ready.Message)
		}
		return nil
	}
	if violations, err := u.policy.Check(ctx, view, agent); err != nil {
		return err
	} else if len(violations) > 0 {
		if err := u.delete(ctx, agent, key); err != nil {
			return err
		}
		// Terminal until the spec (or the namespace's level, or the Tenant) changes, each of which
		// reconciles: no retry.
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, a2av1.ReasonWorkloadNotPermitted,
			"the workload is not run: "+strings.Join(violations, "; "))
		return nil
	}
	return u.run(ctx, agent, key, checksum)
}

// run applies the Deployment when it differs from the one last applied and reports its
// availability.
func (u *agentWorkload) run(ctx context.Context, agent *a2av1.Agent, key client.ObjectKey, checksum string) error {
	deploy, mine, err := u.current(ctx, agent, key)
	if err != nil || !mine {
		return err
	}
	desired, err := u.desired(agent, checksum)
	if err != nil {
		return err
	}
	digest, err := digestOf(desired)
	if err != nil {
		return err
	}
	last, known := u.deployments.get(agent.UID)
	if deploy == nil || !known || last.digest != digest || last.generation != deploy.Generation {
		if err := u.switchToRecreate(ctx, deploy); err != nil {
			return err
		}
		applied, err := u.apply(ctx, desired)
		if apierrors.IsInvalid(err) {
			setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, ReasonWorkloadInvalid, err.Error())
			return nil
		} else if err != nil {
			return fmt.Errorf("apply workload deployment: %w", err)
		}
		u.deployments.set(agent.UID, appliedDeployment{digest: digest, generation: applied.Generation})
		deploy = applied
	}
	setAvailability(agent, deploy)
	return nil
}

// current reads the Agent's Deployment (nil: none yet). mine is false, with WorkloadAvailable
// saying why, when a Deployment of that name exists and is not the Agent's.
func (u *agentWorkload) current(ctx context.Context, agent *a2av1.Agent, key client.ObjectKey) (deploy *appsv1.Deployment, mine bool, err error) {
	deploy = &appsv1.Deployment{}
	err = u.client.Get(ctx, key, deploy)
	if err == nil {
		return deploy, true, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, fmt.Errorf("get workload deployment: %w", err)
	}
	// The cache holds only Deployments with our label: never take over someone else's.
	err = u.apiReader.Get(ctx, key, deploy)
	switch {
	case err == nil && !metav1.IsControlledBy(deploy, agent):
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, a2av1.ReasonWorkloadNotPermitted,
			fmt.Sprintf("Deployment %s exists and is not this Agent's; delete or rename it", key.Name))
		return nil, false, nil
	case err != nil && !apierrors.IsNotFound(err):
		return nil, false, fmt.Errorf("get workload deployment: %w", err)
	}
	return nil, true, nil
}

// setAvailability sets WorkloadAvailable from the Deployment's Available condition.
func setAvailability(agent *a2av1.Agent, deploy *appsv1.Deployment) {
	if available(deploy) {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionTrue, ReasonWorkloadAvailable,
			fmt.Sprintf("%d/%d replicas available", deploy.Status.AvailableReplicas, ptr.Deref(deploy.Spec.Replicas, 1)))
		return
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, ReasonWorkloadProgressing,
		fmt.Sprintf("Deployment %s has %d/%d replicas available", deploy.Name, deploy.Status.AvailableReplicas, ptr.Deref(deploy.Spec.Replicas, 1)))
}

func conditionOf(agent *a2av1.Agent, condType string) metav1.Condition {
	for _, c := range agent.Status.Conditions {
		if c.Type == condType {
			return c
		}
	}
	return metav1.Condition{Reason: a2av1.ReasonBrokerNotConfigured, Message: "not registered"}
}

func (u *agentWorkload) delete(ctx context.Context, agent *a2av1.Agent, key client.ObjectKey) error {
	deploy := &appsv1.Deployment{}
	if err := u.client.Get(ctx, key, deploy); err == nil && metav1.IsControlledBy(deploy, agent) {
		if err := u.client.Delete(ctx, deploy); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete workload: %w", err)
		}
	}
	u.deployments.forget(agent.UID)
	return nil
}

// desired is the Deployment the operator applies for the Agent: the template with the
// operator's labels, identity env, credentials checksum, and the service account token off unless
// the template asks for it.
func (u *agentWorkload) desired(agent *a2av1.Agent, checksum string) (*appsv1.Deployment, error) {
	selector := map[string]string{identity.LabelAgent: agent.Name, "app.kubernetes.io/component": "agent"}
	tmpl := *agent.Spec.Workload.Template.DeepCopy()
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	for k, v := range selector {
		tmpl.Labels[k] = v
	}
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	tmpl.Annotations[AnnotationCredentialsChecksum] = checksum
	if tmpl.Spec.AutomountServiceAccountToken == nil {
		tmpl.Spec.AutomountServiceAccountToken = ptr.To(false)
	}
	env := u.env(agent)
	// The credentials Secret is also mounted read-only, as a credentials folder the SDK reads at
	// every CONNECT (A2A_CREDENTIALS_DIR): no password in the process environment, and a
	// process that reconnects picks up what the Secret holds by then. Mode 0444: the kubelet writes
	// the files as root, group fsGroup only when the pod sets one (the operator does not impose
	// one on the user's template), so 0440 is unreadable by a non-root agent (measured on kind:
	// "open .../username: permission denied"). Only this pod's containers see the volume.
	tmpl.Spec.Volumes = append(slices.DeleteFunc(tmpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == CredentialsVolume }),
		corev1.Volume{Name: CredentialsVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: identity.CredentialsSecretName(agent), DefaultMode: ptr.To[int32](0o444),
		}}})
	for i := range tmpl.Spec.Containers {
		c := &tmpl.Spec.Containers[i]
		c.Env = mergeEnv(c.Env, env)
		c.VolumeMounts = append(slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == CredentialsVolume || m.MountPath == CredentialsMountPath
		}), corev1.VolumeMount{Name: CredentialsVolume, MountPath: CredentialsMountPath, ReadOnly: true})
	}
	deploy := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: WorkloadName(agent), Namespace: agent.Namespace, Labels: map[string]string{
			identity.LabelManagedBy: identity.ManagedByValue, identity.LabelAgent: agent.Name,
		}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(ptr.Deref(agent.Spec.Workload.Replicas, 1)),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: tmpl,
			// Every pod of an Agent connects with the Agent's one client ID: a new pod next to an
			// old one would take its session over (and be taken over in turn). Recreate lets the
			// old pod drain and go first; a staged credential rotation relies on it too
			// (rolledOut).
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
		},
	}
	if err := controllerutil.SetControllerReference(agent, deploy, u.client.Scheme()); err != nil {
		return nil, fmt.Errorf("own workload deployment: %w", err)
	}
	return deploy, nil
}

// apply sends desired with server-side apply under FieldManager and returns what the
// API server made of it.
func (u *agentWorkload) apply(ctx context.Context, desired *appsv1.Deployment) (*appsv1.Deployment, error) {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return nil, fmt.Errorf("convert deployment: %w", err)
	}
	obj := &unstructured.Unstructured{Object: raw}
	// Fields the operator does not set must not be claimed by the apply.
	delete(obj.Object, "status")
	unstructured.RemoveNestedField(obj.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(obj.Object, "spec", "template", "metadata", "creationTimestamp")
	if err := u.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return nil, err
	}
	out := &appsv1.Deployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, out); err != nil {
		return nil, fmt.Errorf("read applied deployment: %w", err)
	}
	return out, nil
}

// switchToRecreate moves a Deployment applied by an older version (the API server's default
// RollingUpdate strategy, with its rollingUpdate parameters) to Recreate. An apply cannot do it:
// the defaulted rollingUpdate field belongs to no field manager, stays, and is invalid next to
// type Recreate. A merge patch removes it (one write, once per Deployment).
func (u *agentWorkload) switchToRecreate(ctx context.Context, deploy *appsv1.Deployment) error {
	if deploy == nil || deploy.Spec.Strategy.RollingUpdate == nil {
		return nil
	}
	patch := []byte(`{"spec":{"strategy":{"type":"Recreate","rollingUpdate":null}}}`)
	if err := u.client.Patch(ctx, deploy, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("switch workload deployment to the Recreate strategy: %w", err)
	}
	return nil
}

// rolledOut reports whether deploy runs only pods of a template carrying the credentials
// checksum: the Deployment controller has seen the generation with that template, and every pod
// it counts is of it, at least one when any is wanted. With the Recreate strategy the new
// ReplicaSet gets pods only once every old pod has terminated (a terminating pod still counts as
// running for it), so a true answer also means the old pods are gone.
func rolledOut(deploy *appsv1.Deployment, checksum string) bool {
	if deploy.Spec.Template.Annotations[AnnotationCredentialsChecksum] != checksum || deploy.Status.ObservedGeneration < deploy.Generation {
		return false
	}
	if ptr.Deref(deploy.Spec.Replicas, 1) == 0 {
		return deploy.Status.Replicas == 0
	}
	return deploy.Status.UpdatedReplicas > 0 && deploy.Status.UpdatedReplicas == deploy.Status.Replicas
}

// workloadCard is the card the operator publishes for the Agent, as JSON, naming the broker URL
// the workload connects to.
func workloadCard(agent *a2av1.Agent, id a2amqtt.AgentRef, brokerURL string) string {
	raw, err := json.Marshal(registration.BuildCard(agent, id, agent.Spec.PoolID, brokerURL))
	if err != nil {
		// An AgentCard of strings, lists and booleans always marshals.
		panic(fmt.Sprintf("marshal the card of %s/%s: %v", agent.Namespace, agent.Name, err))
	}
	return string(raw)
}

func digestOf(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("digest: %w", err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:]), nil
}

// The credentials Secret's volume in every workload pod and where each container mounts it.
const (
	CredentialsVolume    = "a2a-credentials"
	CredentialsMountPath = "/var/run/secrets/a2a.fleet.dev/credentials"
)

// env is what every container of the workload learns about its identity. The password
// comes from the Secret by reference, never as a literal in the pod spec.
func (u *agentWorkload) env(agent *a2av1.Agent) []corev1.EnvVar {
	id := identity.Of(agent)
	secretRef := func(key string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: identity.CredentialsSecretName(agent)}, Key: key,
		}}
	}
	env := []corev1.EnvVar{
		{Name: "A2A_BROKER", Value: u.brokerURL},
		{Name: "A2A_ORG", Value: id.Org},
		{Name: "A2A_UNIT", Value: id.Unit},
		{Name: "A2A_AGENT", Value: id.Agent},
		{Name: "A2A_CLIENT_ID", Value: id.ClientID()},
		{Name: "A2A_REQUEST_TOPIC", Value: cmp.Or(agent.Status.Topics.Delivery, id.RequestTopic())},
		{Name: "A2A_USERNAME", ValueFrom: secretRef(identity.SecretKeyUsername)},
		{Name: "A2A_PASSWORD", ValueFrom: secretRef(identity.SecretKeyPassword)},
		{Name: a2amqtt.EnvCredentialsDir, Value: CredentialsMountPath},
		// The manifest's card, for the process to publish with its presence: one card per agent,
		// whoever writes the retained topic last (docs/api.md, "Which card is the agent's").
		{Name: a2amqtt.EnvAgentCard, Value: workloadCard(agent, id, u.brokerURL)},
	}
	if u.withCA {
		// The file's path, not its content: a rotated CA reaches the pods through the Secret
		// volume (the SDK re-reads it at every TLS handshake) without changing the pod template,
		// so it rolls no pod.
		env = append(env, corev1.EnvVar{Name: a2amqtt.EnvTLSCA, Value: path.Join(CredentialsMountPath, identity.SecretKeyCA)})
	}
	if agent.Spec.PoolID != "" {
		env = append(env, corev1.EnvVar{Name: "A2A_POOLS", Value: agent.Spec.PoolID})
	}
	return env
}

// mergeEnv sets the operator's variables, replacing same-named ones of the template (the
// operator's identity must win) and keeping the rest in order.
func mergeEnv(have, ours []corev1.EnvVar) []corev1.EnvVar {
	names := map[string]bool{}
	for _, e := range ours {
		names[e.Name] = true
	}
	out := make([]corev1.EnvVar, 0, len(have)+len(ours))
	for _, e := range have {
		if !names[e.Name] {
			out = append(out, e)
		}
	}
	return append(out, ours...)
}
