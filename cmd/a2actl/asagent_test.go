package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// The samples' console (nobody may call it) and echo (its org may) Agents, as `make dev` applies
// them.
const (
	consoleManifest = `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: console
spec:
  orgID: acme
  unitID: demo
  card: {name: Console, description: The identity a2actl uses.}
  callers: {scope: None}
`
	echoManifest = `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: echo
spec:
  orgID: acme
  unitID: demo
  card: {name: Echo, description: Repeats every message back.}
  callers: {scope: SameOrg}
`
)

// TestAsAgent: with --as-agent NAME a2actl reads the Agent's credentials Secret through the
// kubeconfig (the operator's real Secret, on a real API server) and talks to another agent over
// the embedded broker, which refuses it without them; the first chat is one command. The Agent's
// short name is ag, and a2a is only its category.
func TestAsAgent(t *testing.T) {
	cp, err := testenv.Start(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := testenv.StartBroker(t, ctx, "embedded")
	ns := cp.StartOperator(t, ctx, "a2actl-", b.Backend, b.URL, controllers.Options{})
	testenv.MustCreate(t, ctx, cp.Client, ns, consoleManifest)
	testenv.MustCreate(t, ctx, cp.Client, ns, echoManifest)
	echoSecret := waitForCredentials(t, ctx, cp.Client, ns, "echo")
	waitForCredentials(t, ctx, cp.Client, ns, "console")
	a, err := agents.Start(ctx, agents.KindEcho, agents.Options{
		BrokerURL: b.URL, Agent: a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "echo"},
		Username: string(echoSecret.Data[identity.SecretKeyUsername]), Password: string(echoSecret.Data[identity.SecretKeyPassword]),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })

	kubeconfig := writeKubeconfig(t, cp, "")
	broker := "--broker=" + b.URL
	// Without credentials the broker refuses the CONNECT.
	if code, _, errOut := runCLI(t, "", "send", broker, "acme/demo/echo", "hello"); code != exitUnreachable {
		t.Fatalf("without --as-agent: exit %d, want %d (refused)\n%s", code, exitUnreachable, errOut)
	}
	code, out, errOut := runCLI(t, "", "send", broker, "--kubeconfig", kubeconfig, "-n", ns, "--as-agent", "console", "acme/demo/echo", "hello")
	if code != exitOK || !strings.Contains(out, "echo: hello") {
		t.Fatalf("send --as-agent console: exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = runCLI(t, "", "send", broker, "--kubeconfig", kubeconfig, "-n", ns, "--as-agent", "nobody", "acme/demo/echo", "hello")
	if code != exitUsage || !strings.Contains(errOut, "--as-agent nobody: read Agent "+ns+"/nobody") {
		t.Fatalf("--as-agent of a missing Agent: exit %d %s", code, errOut)
	}

	// The one command of docs/sdk.md: KUBECONFIG (whose context names the namespace) and the
	// variable instead of the flag.
	t.Setenv("KUBECONFIG", writeKubeconfig(t, cp, ns))
	t.Setenv(envAsAgent, "console")
	code, out, errOut = runCLI(t, "hi there\n/quit\n", "chat", broker, "acme/demo/echo")
	if code != exitOK || !strings.Contains(out, "chatting with acme/demo/echo") || !strings.Contains(out, "echo: hi there") {
		t.Fatalf("chat as console: exit %d\n%s\n%s", code, out, errOut)
	}

	// kubectl get ag lists Agents; kubectl get a2a lists the a2a category (not a short name).
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dc.ServerResourcesForGroupVersion(a2av1.GroupVersion.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.APIResources {
		if slices.Contains(r.ShortNames, "a2a") {
			t.Errorf("%s has the short name a2a, which hides the a2a category", r.Name)
		}
		if r.Name == "agents" && (!slices.Equal(r.ShortNames, []string{"ag"}) || !slices.Contains(r.Categories, "a2a")) {
			t.Errorf("agents: short names %v, categories %v; want [ag] and a2a among the categories", r.ShortNames, r.Categories)
		}
	}
}

// waitForCredentials returns Agent name's credentials Secret once the operator wrote its password.
func waitForCredentials(t *testing.T, ctx context.Context, c client.Client, ns, name string) *corev1.Secret {
	t.Helper()
	secret := &corev1.Secret{}
	key := client.ObjectKey{Namespace: ns, Name: name + "-mqtt-credentials"}
	testenv.Eventually(t, time.Minute, "credentials Secret "+key.String(), func() error {
		if err := c.Get(ctx, key, secret); err != nil {
			return err
		}
		if len(secret.Data[identity.SecretKeyPassword]) == 0 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	return secret
}

// writeKubeconfig writes a kubeconfig for the control plane, its context in namespace ns ("" for
// none), as kubectl would read it.
func writeKubeconfig(t *testing.T, cp *testenv.ControlPlane, ns string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.Config.CertData, ClientKeyData: cp.Config.KeyData, Token: cp.Config.BearerToken}
	cfg.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: ns}
	cfg.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
