package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// gatewayCaller is the HTTP client's identity on the bus: an Agent without a workload that the
// ServiceAccount gw-caller acts as through the gateway (in the demo team: the memory sample
// admits it).
const gatewayCaller = `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: http-caller
  namespace: default
  labels:
    a2a.fleet.dev/team: demo
spec:
  orgID: acme
  unitID: demo
  card:
    name: HTTP caller
    description: An HTTP client calling the fleet through the gateway.
  callers:
    scope: None
  http:
    serviceAccounts: [gw-caller]
`

// portForward forwards a free loopback port of this machine to a port of a Service
// ("svc/NAME") or a pod ("pod/NAME") (kubectl port-forward) until the test ends, and returns the
// local address.
func portForward(ctx context.Context, t *testing.T, namespace, resource, port string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, env.Kubectl, "port-forward", "-n", namespace, resource, "--address", "127.0.0.1", ":"+port)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.Kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	forwarding := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
	found := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if m := forwarding.FindStringSubmatch(s.Text()); m != nil {
				found <- "127.0.0.1:" + m[1]
			}
		}
	}()
	select {
	case addr := <-found:
		return addr
	case <-time.After(30 * time.Second):
		t.Fatalf("kubectl port-forward %s: no local port within 30s", resource)
		return ""
	}
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// gatewayCallsAnAgent installs config/gateway beside the quickstart, exposes confirm and memory
// over HTTP and gives the ServiceAccount gw-caller an identity (the Agent http-caller); a2a-go's
// HTTP client with that ServiceAccount's token reads confirm's card through the gateway Service and
// holds its first turn (input-required, through the conversation service); a call without a
// token is refused with 401. Then the interop checks (gateway_interop_test.go): the JS SDK's HTTP
// client both ways, a2a-go's HTTP server, presence, and a gateway pod killed during a stream.
// The gateway and everything the checks added are removed again at the end.
func (b *bus) gatewayCallsAnAgent(ctx context.Context, t *testing.T) {
	gw, err := env.Kustomization(t.TempDir(), "config/gateway")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-k", gw); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = env.KubectlRun(context.Background(), "delete", "-k", gw, "--ignore-not-found", "--wait=true", "--timeout=2m")
	})
	manifest := filepath.Join(t.TempDir(), "http-caller.yaml")
	if err := os.WriteFile(manifest, []byte(gatewayCaller+"---\n"+gatewayInterop), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gw-caller", "gw-stranger"} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: samplesNamespace, Name: name}}
		if err := env.Client.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sa) })
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-f", manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = env.KubectlRun(context.Background(), "delete", "--ignore-not-found", "--wait=true", "--timeout=2m", "-f", manifest)
	})
	for _, name := range []string{"confirm", "memory"} {
		expose := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"http":{"expose":true}}}`))
		if err := env.Client.Patch(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: samplesNamespace, Name: name}}, expose); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			unexpose := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"http":null}}`))
			_ = env.Client.Patch(context.Background(), &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: samplesNamespace, Name: name}}, unexpose)
		})
	}
	start := time.Now()
	if err := env.WaitDeployments(ctx, Namespace, 3*time.Minute, "a2a-fleet-gateway"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, false, "http-caller", "http-stranger", "confirm", "memory"); err != nil {
		t.Fatal(err)
	}
	t.Logf("gateway available and http-caller Ready %.1fs after the apply", time.Since(start).Seconds())
	tokens := map[string]string{}
	for _, name := range []string{"gw-caller", "gw-stranger"} {
		tr, err := env.Clientset.CoreV1().ServiceAccounts(samplesNamespace).CreateToken(ctx, name,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tr.Status.Token
	}
	gatewayAddr := portForward(ctx, t, Namespace, "svc/a2a-fleet-gateway", "8080")
	base := "http://" + gatewayAddr + "/agents/acme/demo/confirm"

	// No token: refused before anything reaches the bus.
	res, err := http.Get(base + "/.well-known/agent-card.json")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the card without a token: HTTP %d, want 401", res.StatusCode)
	}

	hc := &http.Client{Transport: bearer{token: tokens["gw-caller"], next: http.DefaultTransport}, Timeout: time.Minute}
	var task *a2a.Task
	err = Poll(ctx, 2*time.Minute, "SendMessage to confirm through the gateway", func(ctx context.Context) (bool, string, error) {
		card, err := agentcard.NewResolver(hc).Resolve(ctx, base)
		if err != nil {
			return false, "card: " + err.Error(), nil
		}
		c, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(hc))
		if err != nil {
			return false, "", fmt.Errorf("client from the gateway's card: %w", err)
		}
		defer func() { _ = c.Destroy() }()
		res, err := c.SendMessage(ctx, &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("rename the gateway bucket"))})
		if err != nil {
			return false, "SendMessage: " + err.Error(), nil
		}
		got, ok := res.(*a2a.Task)
		if !ok {
			return false, "", fmt.Errorf("SendMessage answered %T, want a task", res)
		}
		task = got
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if task.Status.State != a2a.TaskStateInputRequired {
		t.Fatalf("confirm through the gateway: task %s in state %s, want input-required", task.ID, task.Status.State)
	}
	t.Logf("a2a-go's HTTP client as ServiceAccount gw-caller: confirm's task %s %s through the gateway, %.1fs after the apply", task.ID, task.Status.State, time.Since(start).Seconds())
	gatewayCardVerifies(ctx, t, hc, "http://"+gatewayAddr, base)

	interop := time.Now()
	t.Run("the JS SDK's HTTP client calls MQTT agents; refusals", func(t *testing.T) {
		jsClientCallsMQTTAgents(ctx, t, gatewayAddr, tokens["gw-caller"], tokens["gw-stranger"])
	})
	t.Run("MQTT requesters call HTTP agents served by the JS SDK and by a2a-go", func(t *testing.T) {
		startHTTPAgents(ctx, t)
		if _, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, true, "deploy-js", "deploy-go"); err != nil {
			t.Fatal(err)
		}
		b.httpAgentsJoinTheFleet(ctx, t)
	})
	t.Run("a gateway pod killed during a stream loses nothing", func(t *testing.T) {
		if _, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, true, "slow-confirm"); err != nil {
			t.Fatal(err)
		}
		gatewayPodKilledDuringAStream(ctx, t, tokens["gw-caller"])
	})
	t.Logf("gateway interop checks on kind: %.1fs (whole gateway check %.1fs)", time.Since(interop).Seconds(), time.Since(start).Seconds())
}

// gatewayCardVerifies fetches the card the gateway serves and checks that it is signed with the
// gateway's own key (the Secret the operator created and the gateway mounts), that the key set
// the gateway serves at its jku verifies it, and that a one-character change does not.
func gatewayCardVerifies(ctx context.Context, t *testing.T, hc *http.Client, gatewayURL, agentBase string) {
	t.Helper()
	get := func(url string) []byte {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = res.Body.Close() }()
		body, err := io.ReadAll(res.Body)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d %v: %s", url, res.StatusCode, err, body)
		}
		return body
	}
	card := get(agentBase + "/.well-known/agent-card.json")
	keys, err := cardsig.ParseKeySet(get(gatewayURL + "/.well-known/jwks.json"))
	if err != nil {
		t.Fatalf("the gateway's key set: %v", err)
	}
	v, err := cardsig.Verify(card, keys)
	if err != nil {
		t.Fatalf("the card the gateway serves does not verify with the key set it serves: %v\n%s", err, card)
	}
	changed := bytes.Replace(card, []byte(`"name":"`), []byte(`"name":"X`), 1)
	if _, err := cardsig.Verify(changed, keys); err == nil {
		t.Fatal("a card changed by one character still verifies")
	}
	t.Logf("the gateway's card is signed by key %s of its own key set (%d keys), a changed card refused", v.KeyID, len(keys.Keys))
}
