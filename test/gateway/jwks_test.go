package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestGatewayServesTheCardKeys: with card signing on and the signatures' jku naming the gateway
// (the operator's --card-keys-url), the gateway serves at /.well-known/jwks.json, without
// credentials, the key set the operator retains on the bus, and a card read from the bus verifies
// with the key set fetched from its jku.
func TestGatewayServesTheCardKeys(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var handler http.Handler
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
		defer gw.Close()
		jwksURL := gw.URL + gateway.JWKSPath

		b := testenv.StartBroker(t, ctx, kind)
		ns := cp.NewNamespace(t, ctx, "gw-jwks-")
		cp.BindNamespace(t, ctx, ns, org)
		cp.StartOperatorWith(t, ctx, testenv.Operator{Namespaces: map[string]string{org: ns}, Broker: registration.BrokerConfig{
			URL: b.URL, Backend: b.Backend,
			CardSigning: &registration.CardSigning{Secret: client.ObjectKey{Namespace: ns, Name: "card-keys"}, Generate: true, Reader: k8s, KeysURL: jwksURL},
		}})
		for _, name := range []string{"keys", "ledger"} {
			testenv.MustCreate(t, ctx, k8s, ns, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: card keys test agent}
`, name, org, unit, name))
		}
		agents := map[string]*a2av1.Agent{}
		testenv.Eventually(t, 60*time.Second, "agents registered with published cards", func() error {
			for _, name := range []string{"keys", "ledger"} {
				ag := &a2av1.Agent{}
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ag); err != nil {
					return err
				}
				if ag.Status.PublishedCardDigest == "" || ag.Status.CredentialsSecret == "" || ag.Status.ClientID == "" {
					return fmt.Errorf("%s not yet", name)
				}
				agents[name] = ag
			}
			return nil
		})

		reader, err := gateway.NewCachedReader(ctx, restCfg, ns)
		if err != nil {
			t.Fatal(err)
		}
		dir := &gateway.Directory{Reader: reader, Namespace: ns}
		pool := gateway.NewPool(gateway.ConnConfig{BrokerURL: b.URL, Logger: slog.New(slog.DiscardHandler)}, dir)
		defer pool.Close(context.Background())
		handler = gateway.NewInbound(gateway.InboundConfig{Directory: dir, Pool: pool, BrokerURL: b.URL,
			Auth:          &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()},
			CardKeysAgent: client.ObjectKey{Namespace: ns, Name: "keys"}, Logger: slog.New(slog.DiscardHandler)})

		// The card as the bus has it, read as ledger.
		sec := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: agents["ledger"].Status.CredentialsSecret}, sec); err != nil {
			t.Fatal(err)
		}
		id := identity.Of(agents["ledger"])
		conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.URL, Username: string(sec.Data[identity.SecretKeyUsername]), Password: string(sec.Data[identity.SecretKeyPassword]), Agent: id})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close(context.Background()) }()
		var card []byte
		testenv.Eventually(t, 30*time.Second, "the signed card on the bus", func() error {
			card = retainedOn(t, ctx, conn, id.DiscoveryTopic())
			if !bytes.Contains(card, []byte(`"signatures"`)) {
				return errors.New("unsigned")
			}
			return nil
		})
		jku := signatureJKU(t, card)
		if jku != jwksURL {
			t.Fatalf("the signature's jku is %q, want the gateway's %q", jku, jwksURL)
		}

		// What a verifier does: fetch the jku, without credentials, and verify the card with it.
		resp, err := http.Get(jku)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/jwk-set+json" {
			t.Fatalf("GET %s: %d %q %s", jku, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		served, err := cardsig.ParseKeySet(body)
		if err != nil {
			t.Fatalf("served key set: %v: %s", err, body)
		}
		retained, err := cardsig.ParseKeySet(retainedOn(t, ctx, conn, a2amqtt.CardKeysTopic))
		if err != nil {
			t.Fatal(err)
		}
		if len(served.Keys) != 1 || len(retained.Keys) != 1 || served.Keys[0].KeyID != retained.Keys[0].KeyID {
			t.Fatalf("served %+v, retained %+v", served.Keys, retained.Keys)
		}
		if v, err := cardsig.Verify(card, served); err != nil || v.KeyID != served.Keys[0].KeyID {
			t.Fatalf("the bus's card does not verify with the served keys: %+v %v", v, err)
		}
		if _, err := cardsig.Verify(bytes.Replace(card, []byte("card keys test agent"), []byte("card keys test agenT"), 1), served); !errors.Is(err, cardsig.ErrInvalidSignature) {
			t.Fatalf("a changed card: %v, want ErrInvalidSignature", err)
		}
	})
}

// retainedOn reads the message retained on topic.
func retainedOn(t testing.TB, ctx context.Context, conn *a2amqtt.Conn, topic string) []byte {
	t.Helper()
	got := make(chan []byte, 1)
	sub, err := conn.Subscribe(ctx, topic, func(p *paho.Publish) {
		select {
		case got <- p.Payload:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close(ctx) }()
	select {
	case p := <-got:
		return p
	case <-time.After(5 * time.Second):
		t.Fatalf("nothing retained on %s", topic)
	}
	return nil
}

// signatureJKU is the jku of a card's first signature's protected header.
func signatureJKU(t testing.TB, card []byte) string {
	t.Helper()
	var c struct {
		Signatures []struct {
			Protected string `json:"protected"`
		} `json:"signatures"`
	}
	if err := json.Unmarshal(card, &c); err != nil || len(c.Signatures) == 0 {
		t.Fatalf("card signatures: %v: %s", err, card)
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(c.Signatures[0].Protected, "="))
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		JKU string `json:"jku"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	return h.JKU
}
