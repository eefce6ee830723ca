package controllers

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// rolledOut decides when a staged password may go to the broker: only when the Deployment
// controller has seen the template with the new checksum and counts only its pods.
func TestRolledOut(t *testing.T) {
	deploy := func(checksum string, generation, observed int64, replicas *int32, status, updated int32) *appsv1.Deployment {
		d := &appsv1.Deployment{}
		d.Generation = generation
		d.Spec.Replicas = replicas
		d.Spec.Template.Annotations = map[string]string{AnnotationCredentialsChecksum: checksum}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: status, UpdatedReplicas: updated}
		return d
	}
	for _, tc := range []struct {
		name string
		d    *appsv1.Deployment
		want bool
	}{
		{"template not applied yet", deploy("old", 2, 2, nil, 1, 1), false},
		{"new template not observed", deploy("new", 3, 2, nil, 1, 1), false},
		{"old pods terminating, new ReplicaSet empty", deploy("new", 3, 3, nil, 0, 0), false},
		{"old and new pods counted (not Recreate)", deploy("new", 3, 3, nil, 2, 1), false},
		{"new pod created", deploy("new", 3, 3, nil, 1, 1), true},
		{"scaled to zero, nothing left", deploy("new", 3, 3, ptr.To[int32](0), 0, 0), true},
		{"scaled to zero, a pod still counted", deploy("new", 3, 3, ptr.To[int32](0), 1, 0), false},
	} {
		if got := rolledOut(tc.d, "new"); got != tc.want {
			t.Errorf("%s: rolledOut = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The broker keeps an old password for at most the pods' termination grace period plus the
// slack for the rollout.
func TestStagedRotationTimeout(t *testing.T) {
	agent := &a2av1.Agent{}
	if got := stagedRotationTimeout(agent); got != 30*time.Second+stagedRotationSlack {
		t.Errorf("no workload: %s", got)
	}
	agent.Spec.Workload = &a2av1.AgentWorkload{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](120)}}}
	if got := stagedRotationTimeout(agent); got != 2*time.Minute+stagedRotationSlack {
		t.Errorf("grace 120 s: %s", got)
	}
}
