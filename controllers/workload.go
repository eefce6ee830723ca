package controllers

import (
	"cmp"
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// Workload reasons.
const (
	ReasonWorkloadAvailable   = "DeploymentAvailable"
	ReasonWorkloadProgressing = "DeploymentProgressing"
	ReasonWorkloadInvalid     = "InvalidWorkload"
)

// WorkloadName is the name of the Deployment that runs an Agent's workload.
func WorkloadName(agent *a2av1.Agent) string { return agent.Name + "-agent" }

// reconcileWorkload creates or updates the Deployment of spec.workload (or deletes it when the
// workload was removed) and sets WorkloadAvailable from the Deployment's own status.
func (r *AgentReconciler) reconcileWorkload(ctx context.Context, agent *a2av1.Agent) error {
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: WorkloadName(agent), Namespace: agent.Namespace}}
	if agent.Spec.Workload == nil || agent.Status.CredentialsSecret == "" {
		// No workload, or no credentials to give it (identity conflict): nothing may run.
		if err := r.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err == nil && metav1.IsControlledBy(deploy, agent) {
			if err := r.Delete(ctx, deploy); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete workload: %w", err)
			}
		}
		if agent.Spec.Workload == nil {
			removeCondition(agent, a2av1.ConditionWorkloadAvailable)
		}
		return nil
	}
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, deploy, func() error {
		if deploy.Labels == nil {
			deploy.Labels = map[string]string{}
		}
		deploy.Labels[identity.LabelManagedBy] = identity.ManagedByValue
		deploy.Labels[identity.LabelAgent] = agent.Name
		selector := map[string]string{identity.LabelAgent: agent.Name, "app.kubernetes.io/component": "agent"}
		deploy.Spec.Replicas = ptr.To(ptr.Deref(agent.Spec.Workload.Replicas, 1))
		deploy.Spec.Selector = &metav1.LabelSelector{MatchLabels: selector}
		tmpl := *agent.Spec.Workload.Template.DeepCopy()
		if tmpl.Labels == nil {
			tmpl.Labels = map[string]string{}
		}
		for k, v := range selector {
			tmpl.Labels[k] = v
		}
		env := r.workloadEnv(agent)
		for i := range tmpl.Spec.Containers {
			tmpl.Spec.Containers[i].Env = mergeEnv(tmpl.Spec.Containers[i].Env, env)
		}
		deploy.Spec.Template = tmpl
		return controllerutil.SetControllerReference(agent, deploy, r.Scheme())
	})
	if err != nil {
		if apierrors.IsInvalid(err) {
			r.setCondition(agent, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, ReasonWorkloadInvalid, err.Error())
			return nil
		}
		return fmt.Errorf("apply workload deployment: %w", err)
	}
	for _, c := range deploy.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			r.setCondition(agent, a2av1.ConditionWorkloadAvailable, metav1.ConditionTrue, ReasonWorkloadAvailable,
				fmt.Sprintf("%d/%d replicas available", deploy.Status.AvailableReplicas, ptr.Deref(deploy.Spec.Replicas, 1)))
			return nil
		}
	}
	r.setCondition(agent, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, ReasonWorkloadProgressing,
		fmt.Sprintf("Deployment %s has %d/%d replicas available", deploy.Name, deploy.Status.AvailableReplicas, ptr.Deref(deploy.Spec.Replicas, 1)))
	return nil
}

// workloadEnv is what every container of the workload learns about its identity. The password
// comes from the Secret by reference, never as a literal in the pod spec.
func (r *AgentReconciler) workloadEnv(agent *a2av1.Agent) []corev1.EnvVar {
	id := identity.Of(agent)
	secretRef := func(key string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: agent.Status.CredentialsSecret}, Key: key,
		}}
	}
	env := []corev1.EnvVar{
		{Name: "A2A_BROKER", Value: r.WorkloadBrokerURL},
		{Name: "A2A_ORG", Value: id.Org},
		{Name: "A2A_UNIT", Value: id.Unit},
		{Name: "A2A_AGENT", Value: id.Agent},
		{Name: "A2A_CLIENT_ID", Value: id.ClientID()},
		{Name: "A2A_REQUEST_TOPIC", Value: cmp.Or(agent.Status.Topics.Delivery, id.RequestTopic())},
		{Name: "A2A_USERNAME", ValueFrom: secretRef(identity.SecretKeyUsername)},
		{Name: "A2A_PASSWORD", ValueFrom: secretRef(identity.SecretKeyPassword)},
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
