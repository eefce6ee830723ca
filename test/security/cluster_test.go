package security_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
)

// readRBAC reads one object of config/rbac, renamed for this test.
func readRBAC(t *testing.T, file string, into client.Object, name, namespace string) client.Object {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	into.SetName(name)
	into.SetNamespace(namespace)
	return into
}

func createAll(t *testing.T, ctx context.Context, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// as returns a client that impersonates user (and groups) through the test's admin credentials.
func as(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestOperatorRBACAndWorkloadBounds runs the operator as its ServiceAccount with exactly the
// shipped RBAC (config/rbac: the generated ClusterRole and the leader-election Role) and leader
// election on, so any missing permission fails the test; and replays attack 8 (permission to create
// an Agent is not permission to run any pod) and the RBAC attacks of a namespace owner.
func TestOperatorRBACAndWorkloadBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opNS := cp.NewNamespace(t, ctx, "sec-op-")
	team := cp.NewNamespace(t, ctx, "sec-team-")
	strict := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sec-strict-", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	other := cp.NewNamespace(t, ctx, "sec-other-")
	createAll(t, ctx, strict)
	sa := "system:serviceaccount:" + opNS + ":operator"
	role := readRBAC(t, "role.yaml", &rbacv1.ClusterRole{}, "sec-manager-role", "")
	leRole := readRBAC(t, "leader_election_role.yaml", &rbacv1.Role{}, "leader-election", opNS)
	editor := readRBAC(t, "a2a_editor_role.yaml", &rbacv1.ClusterRole{}, "sec-editor-role", "")
	createAll(t, ctx, role, leRole, editor,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: "operator"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "sec-manager"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.GetName()},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: opNS, Name: "operator"}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: "leader-election"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: leRole.GetName()},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: opNS, Name: "operator"}}},
		// alice owns namespace team: the editor role there, nothing else.
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "alice"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: editor.GetName()},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}}},
		&a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "sec-rbac"}, Spec: a2av1.TenantSpec{
			OrgID: "rbac", Namespaces: []string{team, strict.Name}, WorkloadServiceAccounts: []string{"runner"}}},
	)

	// The operator, as its ServiceAccount, with leader election.
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + opNS, "system:authenticated"}}
	cacheOpts := controllers.CacheOptions()
	cacheOpts.DefaultNamespaces = map[string]cache.Config{team: {}, strict.Name: {}, other: {}}
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: cp.Scheme, Cache: cacheOpts,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		LeaderElection: true, LeaderElectionNamespace: opNS, LeaderElectionID: "a2a-fleet-operator.a2a.fleet.dev",
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := controllers.Setup(ctx, mgr, controllers.Options{}); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(mctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })

	alice := as(t, "alice", "system:authenticated")
	pod := func(extra string) string {
		return "  workload:\n    template:\n      spec:\n" + extra + "        containers:\n        - name: agent\n          image: example/agent:1\n"
	}
	for _, m := range []struct{ name, ns, spec string }{
		{"ok", team, pod("")},
		{"runner", team, pod("        serviceAccountName: runner\n")},
	} {
		if err := create(t, ctx, alice, m.ns, agentYAML(m.name, "rbac", "u", "", m.spec)); err != nil {
			t.Fatalf("the namespace owner cannot create an Agent: %v", err)
		}
	}

	t.Run("the shipped RBAC is enough", func(t *testing.T) {
		a := condition(t, ctx, team, "ok", a2av1.ConditionRegistered, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured, "")
		if a.Status.CredentialsSecret == "" {
			t.Error("no credentials Secret")
		}
		deploy := &appsv1.Deployment{}
		eventually(t, "workload applied", func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: team, Name: "ok-agent"}, deploy)
		})
		spec := deploy.Spec.Template.Spec
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Error("the service account token is mounted without being asked for")
		}
		if deploy.Spec.Template.Annotations[controllers.AnnotationCredentialsChecksum] == "" {
			t.Error("no credentials checksum in the pod template")
		}
		if len(deploy.ManagedFields) == 0 || deploy.ManagedFields[0].Manager != controllers.FieldManager {
			t.Errorf("the Deployment is not server-side applied by %s: %+v", controllers.FieldManager, deploy.ManagedFields)
		}
		eventually(t, "workload with an allowed ServiceAccount", func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: team, Name: "runner-agent"}, &appsv1.Deployment{})
		})
		eventually(t, "Tenant status written", func() error {
			tn := &a2av1.Tenant{}
			if err := k8s.Get(ctx, types.NamespacedName{Name: "sec-rbac"}, tn); err != nil {
				return err
			}
			if tn.Status.BoundNamespaces != 2 {
				return fmt.Errorf("tenant status %+v", tn.Status)
			}
			return nil
		})
		eventually(t, "leader elected and its Events recorded", func() error {
			lease := &coordinationv1.Lease{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: "a2a-fleet-operator.a2a.fleet.dev"}, lease); err != nil {
				return err
			}
			var core corev1.EventList
			var modern eventsv1.EventList
			if err := k8s.List(ctx, &core, client.InNamespace(opNS)); err != nil {
				return err
			}
			if err := k8s.List(ctx, &modern, client.InNamespace(opNS)); err != nil {
				return err
			}
			if len(core.Items)+len(modern.Items) == 0 {
				return fmt.Errorf("no leader election Event in %s (forbidden?)", opNS)
			}
			return nil
		})
		eventually(t, "Agent Events recorded", func() error {
			var evs eventsv1.EventList
			if err := k8s.List(ctx, &evs, client.InNamespace(team)); err != nil {
				return err
			}
			if len(evs.Items) == 0 {
				return fmt.Errorf("no Events on the Agents")
			}
			return nil
		})
	})

	t.Run("8 workloads within bounds", func(t *testing.T) {
		cases := []struct{ name, ns, spec, want string }{
			{"privileged", team, pod("") + "          securityContext: {privileged: true}\n", "privileged"},
			{"hostpath", team, pod("        volumes: [{name: root, hostPath: {path: /}}]\n"), "hostPath"},
			{"hostnet", team, pod("        hostNetwork: true\n"), "host namespaces"},
			{"admin-sa", team, pod("        serviceAccountName: admin\n"), "serviceAccountName admin is not allowed"},
			{"steal-env", team, pod("") + "          env: [{name: X, valueFrom: {secretKeyRef: {name: db-password, key: pw}}}]\n", "references Secret db-password"},
			{"steal-volume", team, pod("        volumes: [{name: s, secret: {secretName: tls-key}}]\n"), "references Secret tls-key"},
			{"not-restricted", strict.Name, pod(""), `Pod Security "restricted"`},
		}
		for _, tc := range cases {
			if err := create(t, ctx, alice, tc.ns, agentYAML(tc.name, "rbac", "u", "", tc.spec)); err != nil && tc.ns == team {
				t.Fatalf("create %s: %v", tc.name, err)
			} else if err != nil {
				// alice owns only team; the admin creates in the strict namespace.
				mustCreate(t, ctx, tc.ns, agentYAML(tc.name, "rbac", "u", "", tc.spec))
			}
		}
		for _, tc := range cases {
			condition(t, ctx, tc.ns, tc.name, a2av1.ConditionWorkloadAvailable, metav1.ConditionFalse, a2av1.ReasonWorkloadNotPermitted, tc.want)
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: tc.ns, Name: tc.name + "-agent"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: a Deployment exists (err %v)", tc.name, err)
			}
		}
		// Fixing the spec runs it.
		patch(t, ctx, team, "hostnet", `{"spec":{"workload":{"template":{"spec":{"hostNetwork":false}}}}}`)
		eventually(t, "fixed workload applied", func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: team, Name: "hostnet-agent"}, &appsv1.Deployment{})
		})
	})

	t.Run("9 a namespace owner cannot widen their own rights", func(t *testing.T) {
		forbidden := func(what string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: want Forbidden, got %v", what, err)
			}
		}
		forbidden("create a Tenant", create(t, ctx, alice, "", `apiVersion: a2a.fleet.dev/v1alpha1
kind: Tenant
metadata: {name: alice-takes-acme}
spec: {orgID: acme, namespaces: [`+team+`]}
`))
		forbidden("consent on behalf of another namespace", create(t, ctx, alice, other, `apiVersion: a2a.fleet.dev/v1alpha1
kind: AgentGrant
metadata: {name: g}
spec: {from: [{namespace: `+team+`}], to: [{kind: Callers}]}
`))
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: team}}
		forbidden("label the namespace (to join a Tenant's selector)", alice.Patch(ctx, ns, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"tenant":"acme"}}}`))))
		forbidden("read another namespace's credentials", alice.Get(ctx, client.ObjectKey{Namespace: other, Name: "x"}, &corev1.Secret{}))
		if err := create(t, ctx, alice, team, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: AgentGrant
metadata: {name: own}
spec: {from: [{namespace: %s}], to: [{kind: Callers}]}
`, other)); err != nil {
			t.Errorf("a namespace owner cannot consent for their own namespace: %v", err)
		}
		// The operator's own rights stop at what it needs: it cannot, say, write RBAC or read
		// arbitrary cluster objects it has no business with.
		operator := as(t, sa, "system:serviceaccounts", "system:authenticated")
		forbidden("operator creates a ClusterRoleBinding", operator.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "escalate"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}}))
		forbidden("operator lists pods", operator.List(ctx, &corev1.PodList{}))
		forbidden("operator writes Tenants", operator.Create(ctx, &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "op"}, Spec: a2av1.TenantSpec{OrgID: "x", Namespaces: []string{"x"}}}))
		if err := operator.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "l"}}); !apierrors.IsForbidden(err) {
			t.Errorf("leases outside the operator's namespace: want Forbidden, got %v", err)
		}
	})
}
