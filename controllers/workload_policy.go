package controllers

import (
	"context"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// DefaultWorkloadSecurityFloor is the lowest Pod Security level an Agent workload is checked at,
// whatever its namespace says.
const DefaultWorkloadSecurityFloor = psaapi.LevelBaseline

// WorkloadPolicy bounds what spec.workload may ask for, so that permission to create an Agent is
// not permission to run any pod: the operator creates the Deployment with its own rights, so it
// checks what the Agent's author could not be trusted to check (docs/security.md).
//
//   - The pod template must pass the Pod Security Standards (k8s.io/pod-security-admission, the
//     checks the API server's admission runs) at the namespace's enforce level, never below Floor.
//   - Whatever the level: no privileged containers, no host namespaces, no hostPath volumes.
//   - It runs as the namespace's default ServiceAccount or one its Tenant lists in
//     workloadServiceAccounts; the token is not mounted unless the template asks for it.
//   - It references no Secret but the Agent's own credentials (env, envFrom, volumes, projected
//     volumes); imagePullSecrets are allowed (they only pull images).
type WorkloadPolicy struct {
	// Floor is the lowest level checked (DefaultWorkloadSecurityFloor when empty).
	Floor     psaapi.Level
	evaluator psapolicy.Evaluator
}

// NewWorkloadPolicy builds the policy with the Pod Security checks of this Kubernetes release.
func NewWorkloadPolicy(floor psaapi.Level) (*WorkloadPolicy, error) {
	if floor == "" {
		floor = DefaultWorkloadSecurityFloor
	}
	if !floor.Valid() {
		return nil, fmt.Errorf("workload security floor %q is not a Pod Security level (privileged, baseline, restricted)", floor)
	}
	ev, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		return nil, fmt.Errorf("pod security evaluator: %w", err)
	}
	return &WorkloadPolicy{Floor: floor, evaluator: ev}, nil
}

// levelRank orders Pod Security levels from the most permissive.
var levelRank = map[psaapi.Level]int{psaapi.LevelPrivileged: 0, psaapi.LevelBaseline: 1, psaapi.LevelRestricted: 2}

// Check returns what is wrong with agent's workload (nil: nothing).
func (p *WorkloadPolicy) Check(ctx context.Context, view *tenancy.View, agent *a2av1.Agent) ([]string, error) {
	if agent.Spec.Workload == nil {
		return nil, nil
	}
	ns, err := view.Namespace(ctx, agent.Namespace)
	if err != nil {
		return nil, err
	}
	tmpl := agent.Spec.Workload.Template
	spec := tmpl.Spec.DeepCopy()
	if spec.AutomountServiceAccountToken == nil {
		spec.AutomountServiceAccountToken = new(bool) // what the operator will apply
	}
	out := p.podSecurity(ns, &tmpl.ObjectMeta, spec)
	out = append(out, hostAccess(spec)...)
	var allowed []string
	if t := view.Bindings().TenantFor(ns); t != nil {
		allowed = t.Spec.WorkloadServiceAccounts
	}
	out = append(out, serviceAccountViolations(spec, allowed)...)
	own := identity.CredentialsSecretName(agent)
	for _, ref := range secretRefs(spec) {
		if ref.name != own {
			out = append(out, fmt.Sprintf("%s references Secret %s: only the Agent's own credentials Secret %s may be referenced", ref.where, ref.name, own))
		}
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// podSecurity checks spec against the Pod Security Standards at the namespace's enforce level,
// never below Floor.
func (p *WorkloadPolicy) podSecurity(ns *corev1.Namespace, meta *metav1.ObjectMeta, spec *corev1.PodSpec) []string {
	level, version := p.Floor, psaapi.LatestVersion()
	if l, err := psaapi.ParseLevel(ns.Labels[psaapi.EnforceLevelLabel]); err == nil && levelRank[l] > levelRank[level] {
		level = l
		if v, err := psaapi.ParseVersion(ns.Labels[psaapi.EnforceVersionLabel]); err == nil {
			version = v
		}
	}
	var out []string
	for _, res := range p.evaluator.EvaluatePod(psaapi.LevelVersion{Level: level, Version: version}, meta, spec) {
		if !res.Allowed {
			out = append(out, fmt.Sprintf("Pod Security %q: %s (%s)", level, res.ForbiddenReason, res.ForbiddenDetail))
		}
	}
	return out
}

// hostAccess lists what the operator refuses whatever the level: host namespaces, privileged
// containers, hostPath volumes.
func hostAccess(spec *corev1.PodSpec) []string {
	var out []string
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		out = append(out, "host namespaces (hostNetwork, hostPID, hostIPC) are not allowed")
	}
	for _, c := range allContainers(spec) {
		if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			out = append(out, fmt.Sprintf("container %s: privileged is not allowed", c.Name))
		}
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out = append(out, fmt.Sprintf("volume %s: hostPath is not allowed", v.Name))
		}
	}
	return out
}

// serviceAccountViolations: the pod runs as default or a ServiceAccount of allowed (the Tenant's
// workloadServiceAccounts).
func serviceAccountViolations(spec *corev1.PodSpec, allowed []string) []string {
	var out []string
	if sa := spec.ServiceAccountName; sa != "" && sa != "default" && !slices.Contains(allowed, sa) {
		out = append(out, fmt.Sprintf("serviceAccountName %s is not allowed: only default, or a ServiceAccount the namespace's Tenant lists in workloadServiceAccounts", sa))
	}
	if spec.DeprecatedServiceAccount != "" && spec.DeprecatedServiceAccount != spec.ServiceAccountName {
		out = append(out, "serviceAccount (deprecated) must be empty or equal serviceAccountName")
	}
	return out
}

type secretRef struct{ where, name string }

func allContainers(spec *corev1.PodSpec) []corev1.Container {
	out := append(slices.Clone(spec.InitContainers), spec.Containers...)
	for _, e := range spec.EphemeralContainers {
		out = append(out, corev1.Container(e.EphemeralContainerCommon))
	}
	return out
}

// secretRefs lists every Secret a pod spec reads (imagePullSecrets aside).
func secretRefs(spec *corev1.PodSpec) []secretRef {
	var out []secretRef
	for _, c := range allContainers(spec) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out = append(out, secretRef{fmt.Sprintf("container %s env %s", c.Name, e.Name), e.ValueFrom.SecretKeyRef.Name})
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				out = append(out, secretRef{fmt.Sprintf("container %s envFrom", c.Name), e.SecretRef.Name})
			}
		}
	}
	for _, v := range spec.Volumes {
		for _, name := range volumeSecrets(&v) {
			out = append(out, secretRef{"volume " + v.Name, name})
		}
	}
	return out
}

// volumeSecrets lists the Secrets a volume reads, one source kind per entry.
func volumeSecrets(v *corev1.Volume) []string {
	var out []string
	for _, of := range volumeSecretSources {
		if name, ok := of(v); ok {
			out = append(out, name)
		}
	}
	if v.Projected != nil {
		for _, s := range v.Projected.Sources {
			if s.Secret != nil {
				out = append(out, s.Secret.Name)
			}
		}
	}
	return out
}

// volumeSecretSources read the Secret of each volume source that names one.
var volumeSecretSources = []func(*corev1.Volume) (string, bool){
	func(v *corev1.Volume) (string, bool) {
		return secretName(v.Secret, func(s *corev1.SecretVolumeSource) string { return s.SecretName })
	},
	func(v *corev1.Volume) (string, bool) {
		return secretName(v.AzureFile, func(s *corev1.AzureFileVolumeSource) string { return s.SecretName })
	},
	func(v *corev1.Volume) (string, bool) {
		if v.CSI == nil {
			return "", false
		}
		return localRef(v.CSI.NodePublishSecretRef)
	},
	func(v *corev1.Volume) (string, bool) {
		if v.CephFS == nil {
			return "", false
		}
		return localRef(v.CephFS.SecretRef)
	},
	func(v *corev1.Volume) (string, bool) {
		if v.FlexVolume == nil {
			return "", false
		}
		return localRef(v.FlexVolume.SecretRef)
	},
	func(v *corev1.Volume) (string, bool) {
		if v.ISCSI == nil {
			return "", false
		}
		return localRef(v.ISCSI.SecretRef)
	},
	func(v *corev1.Volume) (string, bool) {
		if v.RBD == nil {
			return "", false
		}
		return localRef(v.RBD.SecretRef)
	},
	func(v *corev1.Volume) (string, bool) {
		if v.ScaleIO == nil {
			return "", false
		}
		return localRef(v.ScaleIO.SecretRef)
	},
	func(v *corev1.Volume) (string, bool) {
		if v.StorageOS == nil {
			return "", false
		}
		return localRef(v.StorageOS.SecretRef)
	},
}

func secretName[T any](src *T, name func(*T) string) (string, bool) {
	if src == nil {
		return "", false
	}
	return name(src), true
}

func localRef(ref *corev1.LocalObjectReference) (string, bool) {
	if ref == nil {
		return "", false
	}
	return ref.Name, true
}
