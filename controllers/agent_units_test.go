package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

// The units' own decisions, without a control plane (the envtest suite runs them together).

func unitAgent() *a2av1.Agent {
	return &a2av1.Agent{
		ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: "acme", UID: types.UID("uid-memory"), Generation: 3},
		Spec:       a2av1.AgentSpec{OrgID: "acme", UnitID: "sales", AgentID: "memory"},
	}
}

func condition(agent *a2av1.Agent, t string) *metav1.Condition {
	return meta.FindStatusCondition(agent.Status.Conditions, t)
}

// credentials: which write a new password needs and what it is reported as.
func TestCredentialsWrite(t *testing.T) {
	const staged = "the workload rolls to it"
	cases := []struct {
		name                                  string
		exists, recorded, needPassword, stage bool
		write, event, noteHas                 string
	}{
		{"a new Agent's first credentials: no Event", false, false, true, false, "create", "", ""},
		{"a deleted Secret", false, true, true, false, "create", EventCredentialsRecreate, "was deleted"},
		{"a deleted Secret while the workload runs", false, true, true, true, "create", EventCredentialsRecreate, staged},
		{"a rotation", true, true, true, false, "update", EventCredentialsRotated, "generated a new broker password"},
		{"a staged rotation", true, true, true, true, "update", EventCredentialsRotated, staged},
		{"an identity rewritten (renamed client ID)", true, true, false, false, "update", EventCredentialsRotated, "rewrote the identity"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			write, event, note := credentialsWrite(tc.exists, tc.recorded, tc.needPassword, tc.stage)
			if write != tc.write || event != tc.event || !strings.Contains(note, tc.noteHas) {
				t.Fatalf("credentialsWrite = %q %q %q, want %q %q containing %q", write, event, note, tc.write, tc.event, tc.noteHas)
			}
			if !tc.stage && strings.Contains(note, staged) {
				t.Fatalf("an unstaged write says it is staged: %q", note)
			}
		})
	}
	if !needsPassword(&corev1.Secret{}, "") {
		t.Error("a Secret without a password needs one")
	}
	s := &corev1.Secret{Data: map[string][]byte{identity.SecretKeyPassword: []byte("p")}, ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{annotationRotatedFor: "1"}}}
	if needsPassword(s, "1") || !needsPassword(s, "2") || needsPassword(s, "") {
		t.Error("a rotation is asked for by a new annotation value only")
	}
}

// registration without a broker: both broker conditions Unknown, and the Secret is still written.
func TestRegistrationWithoutBroker(t *testing.T) {
	agent := unitAgent()
	persisted := 0
	res, err := (&agentRegistration{}).register(context.Background(), nil, agent, registration.Credentials{}, func(context.Context) error {
		persisted++
		return nil
	})
	if err != nil || res.RequeueAfter != 0 || persisted != 1 {
		t.Fatalf("register = %v, %v, persisted %d times; want no requeue, no error, persisted once", res, err, persisted)
	}
	for _, c := range []string{a2av1.ConditionRegistered, a2av1.ConditionACLsSynced} {
		if got := condition(agent, c); got == nil || got.Status != metav1.ConditionUnknown || got.Reason != a2av1.ReasonBrokerNotConfigured {
			t.Errorf("%s = %+v, want Unknown/%s", c, got, a2av1.ReasonBrokerNotConfigured)
		}
	}
	if (&agentRegistration{}).takeLost(agent) {
		t.Error("an operator without broker resyncs found a lost agent")
	}
}

// registration: which shared objects an Agent still waits for. Before the shared reconcile has
// applied a key since the start, a True ACLsSynced of this generation is trusted.
func TestRegistrationSharedWaiting(t *testing.T) {
	agent := unitAgent()
	agent.Spec.Callers.Scope = a2av1.CallerScopeSameUnit
	self := registration.Member{Agent: identity.Of(agent), Scope: a2av1.CallerScopeSameUnit}
	u := &agentRegistration{shared: NewSharedTracker()}
	if got := u.sharedWaiting(agent, self); !slices.Equal(got, []string{"unit:acme/sales", "org:acme"}) {
		t.Fatalf("waiting = %v, want the unit and the org", got)
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionTrue, a2av1.ReasonACLsApplied, "")
	if got := u.sharedWaiting(agent, self); len(got) != 0 {
		t.Fatalf("waiting = %v after a True ACLsSynced of this generation, want none", got)
	}
	u.shared.record(registration.UnitKey("acme", "sales"), map[types.UID]trackedEntry{})
	if got := u.sharedWaiting(agent, self); !slices.Equal(got, []string{"unit:acme/sales"}) {
		t.Fatalf("waiting = %v once the unit was applied without the agent, want the unit", got)
	}
}

// status: Ready is the first condition that is not True, and Events mark news only.
func TestStatusDerivesReady(t *testing.T) {
	rec := &events.FakeRecorder{Events: make(chan string, 10)}
	u := &agentStatus{recorder: rec}
	agent := unitAgent()
	agent.Status.ClientID = "acme/sales/memory"
	for _, c := range []string{a2av1.ConditionIdentityPermitted, a2av1.ConditionRegistered, a2av1.ConditionACLsSynced} {
		setCondition(&agent.Status.Conditions, agent.Generation, c, metav1.ConditionTrue, "Fine", "fine")
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, ReasonWorkloadProgressing, "0/1 replicas available")
	u.derive(agent, nil)
	if c := condition(agent, a2av1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != ReasonWorkloadProgressing {
		t.Fatalf("Ready = %+v, want False/%s", c, ReasonWorkloadProgressing)
	}
	if condition(agent, a2av1.ConditionConnected) != nil {
		t.Error("Connected without a presence reader")
	}
	before := agent.DeepCopy()
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionTrue, ReasonWorkloadAvailable, "1/1")
	u.derive(agent, nil)
	if c := condition(agent, a2av1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready = %+v, want True", c)
	}
	u.emitTransitions(before, agent, nil)
	if got := len(rec.Events); got != 1 || !strings.Contains(<-rec.Events, EventReady) {
		t.Fatalf("recovering from NotReady recorded %d Events, want one %s", got, EventReady)
	}
	// Pools the broker cannot serve keep an otherwise ready Agent not Ready.
	agent.Spec.PoolID = "workers"
	(&agentStatus{recorder: rec, poolsUnsupported: "no shared $-subscriptions"}).derive(agent, nil)
	if c := condition(agent, a2av1.ConditionReady); c.Reason != a2av1.ReasonPoolUnsupportedByBroker {
		t.Fatalf("Ready = %+v, want %s", c, a2av1.ReasonPoolUnsupportedByBroker)
	}
}

// workload: WorkloadAvailable follows the Deployment's Available condition.
func TestWorkloadAvailability(t *testing.T) {
	agent := unitAgent()
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "memory-agent"}}
	setAvailability(agent, d)
	if c := condition(agent, a2av1.ConditionWorkloadAvailable); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "memory-agent has 0/1") {
		t.Fatalf("WorkloadAvailable = %+v, want False naming the Deployment", c)
	}
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}
	d.Status.AvailableReplicas = 1
	setAvailability(agent, d)
	if c := condition(agent, a2av1.ConditionWorkloadAvailable); c.Status != metav1.ConditionTrue || c.Message != "1/1 replicas available" {
		t.Fatalf("WorkloadAvailable = %+v, want True 1/1", c)
	}
}

// workload policy: every source of a Secret a pod can read is found.
func TestSecretRefsEverySource(t *testing.T) {
	ref := func(n string) *corev1.LocalObjectReference { return &corev1.LocalObjectReference{Name: n} }
	spec := &corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c",
			Env:     []corev1.EnvVar{{Name: "E", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: *ref("env")}}}},
			EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: *ref("envfrom")}}},
		}},
		Volumes: []corev1.Volume{
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "secret"}}},
			{Name: "projected", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{Secret: &corev1.SecretProjection{LocalObjectReference: *ref("projected")}}, {ConfigMap: &corev1.ConfigMapProjection{}}}}}},
			{Name: "csi", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{NodePublishSecretRef: ref("csi")}}},
			{Name: "azure", VolumeSource: corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{SecretName: "azure"}}},
			{Name: "cephfs", VolumeSource: corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{SecretRef: ref("cephfs")}}},
			{Name: "flex", VolumeSource: corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{SecretRef: ref("flex")}}},
			{Name: "iscsi", VolumeSource: corev1.VolumeSource{ISCSI: &corev1.ISCSIVolumeSource{SecretRef: ref("iscsi")}}},
			{Name: "rbd", VolumeSource: corev1.VolumeSource{RBD: &corev1.RBDVolumeSource{SecretRef: ref("rbd")}}},
			{Name: "scaleio", VolumeSource: corev1.VolumeSource{ScaleIO: &corev1.ScaleIOVolumeSource{SecretRef: ref("scaleio")}}},
			{Name: "storageos", VolumeSource: corev1.VolumeSource{StorageOS: &corev1.StorageOSVolumeSource{SecretRef: ref("storageos")}}},
			{Name: "csi-without-secret", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{}}},
			{Name: "empty", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
	}
	var got []string
	for _, r := range secretRefs(spec) {
		got = append(got, r.where+"="+r.name)
	}
	want := []string{"container c env E=env", "container c envFrom=envfrom"}
	for _, v := range []string{"secret", "projected", "csi", "azure", "cephfs", "flex", "iscsi", "rbd", "scaleio", "storageos"} {
		want = append(want, "volume "+v+"="+v)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("secretRefs = %v\nwant %v", got, want)
	}
}

// identity: topics, the governing policy and IdentityPermitted, read through a client (the
// controller-runtime fake: the envtest suite checks the same against an API server).
func TestIdentityObserveAndPermit(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := a2av1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	policy := &a2av1.ConversationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "audit", Namespace: "acme"},
		Spec: a2av1.ConversationPolicySpec{AgentSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "memory"}}}}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(policy, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "acme"}}).
		WithIndex(&a2av1.Agent{}, identity.IndexAgentClientID, func(o client.Object) []string {
			return []string{identity.Of(o.(*a2av1.Agent)).ClientID()}
		}).Build()
	u := &agentIdentity{reader: reader, gating: true}
	agent := unitAgent()
	agent.Labels = map[string]string{"app": "memory"}
	if err := u.observe(ctx, agent); err != nil {
		t.Fatal(err)
	}
	if agent.Status.ConversationPolicy != "audit" || agent.Status.Topics.Delivery == "" || agent.Status.ClientID != identity.Of(agent).ClientID() {
		t.Fatalf("observe: policy %q, topics %+v, client ID %q", agent.Status.ConversationPolicy, agent.Status.Topics, agent.Status.ClientID)
	}
	view, err := u.view(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if why, err := u.permit(ctx, view, agent); err != nil || why != nil {
		t.Fatalf("permit = %+v, %v: namespace acme may claim org acme", why, err)
	}
	if c := condition(agent, a2av1.ConditionIdentityPermitted); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("IdentityPermitted = %+v", c)
	}
	agent.Spec.OrgID = "globex"
	why, err := u.permit(ctx, view, agent)
	if err != nil || why == nil || why.reason != a2av1.ReasonIdentityNotPermitted {
		t.Fatalf("permit = %+v, %v: namespace acme may not claim org globex", why, err)
	}
	if c := condition(agent, a2av1.ConditionIdentityPermitted); c.Status != metav1.ConditionFalse || c.Message != why.message {
		t.Fatalf("IdentityPermitted = %+v, want False with the refusal", c)
	}
}
