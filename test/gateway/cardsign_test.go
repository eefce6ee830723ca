package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// TestServedCardsAreSigned: with its own signing keys (--card-signing-dir) the gateway signs the
// card it serves for an exposed agent, for the URL it serves it at; a2a-go's card resolver reads
// it, and it verifies with the key set the gateway serves at the signature's jku. A
// one-character change, the card moved to another URL, and a key set without the gateway's
// keys all fail. A key added to the folder signs too once the gateway reads it again.
func TestServedCardsAreSigned(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		st.startMQTTAgent(t, ctx, "direct", false)
		dir := t.TempDir()
		key := mustKey(t)
		writeKey(t, dir, "card-signing.pem", key)
		signer, err := gateway.NewCardSigner(dir)
		if err != nil {
			t.Fatal(err)
		}
		reader, err := gateway.NewCachedReader(ctx, restCfg, st.ns)
		if err != nil {
			t.Fatal(err)
		}
		gdir := &gateway.Directory{Reader: reader, Namespace: st.ns}
		pool := gateway.NewPool(gateway.ConnConfig{BrokerURL: st.brokerURL, Logger: slog.New(slog.DiscardHandler)}, gdir)
		defer pool.Close(context.Background())
		srv := httptest.NewServer(gateway.NewInbound(gateway.InboundConfig{Directory: gdir, Pool: pool, BrokerURL: st.brokerURL,
			Auth: &gateway.TokenReviewer{Reviews: kube.AuthenticationV1().TokenReviews()}, CardSigner: signer, Logger: slog.New(slog.DiscardHandler)}))
		defer srv.Close()

		// What an HTTP client does: resolve the card (a2a-go), fetch the key set its signature
		// names, verify.
		client, card := httpClient(t, ctx, srv.URL, "direct", st.token(t, ctx, "caller"))
		if len(card.Signatures) != 1 {
			t.Fatalf("served card has %d signatures, want 1", len(card.Signatures))
		}
		if got := card.SupportedInterfaces[0].URL; !strings.HasPrefix(got, srv.URL+"/agents/") {
			t.Fatalf("interface %s is not the gateway's", got)
		}
		raw, err := json.Marshal(card)
		if err != nil {
			t.Fatal(err)
		}
		jku := signatureJKU(t, raw)
		if jku != srv.URL+gateway.JWKSPath {
			t.Fatalf("jku %s, want the gateway's key set", jku)
		}
		keys := fetchKeySet(t, jku)
		if len(keys) == 0 {
			t.Fatal("empty key set")
		}
		set, err := cardsig.ParseKeySet(keys)
		if err != nil {
			t.Fatal(err)
		}
		v, err := cardsig.Verify(raw, set)
		if err != nil || v.KeyID != key.ID {
			t.Fatalf("the served card does not verify with the gateway's key set: %+v %v\n%s", v, err, raw)
		}
		if res, err := client.SendMessage(ctx, userMsg("", "", "signed")); err != nil || res == nil {
			t.Fatalf("call through the verified card: %v %v", res, err)
		}

		for _, tc := range []struct {
			name, from, to string
			want           error
		}{
			{"one character", `"name":"direct"`, `"name":"Direct"`, cardsig.ErrInvalidSignature},
			{"another URL", srv.URL, "http://gateway.example", cardsig.ErrInvalidSignature},
		} {
			changed := bytes.Replace(raw, []byte(tc.from), []byte(tc.to), 1)
			if bytes.Equal(changed, raw) {
				t.Fatalf("%s: nothing changed", tc.name)
			}
			if _, err := cardsig.Verify(changed, set); !errors.Is(err, tc.want) {
				t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
		other := cardsig.KeySet(mustKey(t))
		if _, err := cardsig.Verify(raw, &other); !errors.Is(err, cardsig.ErrUntrustedKey) {
			t.Fatalf("verified with a key set without the gateway's keys: %v", err)
		}
	})
}

// TestCardSignerReadsItsFolder: every key file of the folder signs (tls.key and *.pem, nothing
// else), a folder without a key is refused.
func TestCardSignerReadsItsFolder(t *testing.T) {
	dir := t.TempDir()
	if _, err := gateway.NewCardSigner(dir); err == nil {
		t.Fatal("a folder without keys was accepted")
	}
	a, b := mustKey(t), mustKey(t)
	writeKey(t, dir, "tls.key", a)
	writeKey(t, dir, "next.pem", b)
	writeKey(t, dir, "ignored.txt", mustKey(t))
	s, err := gateway.NewCardSigner(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := s.PublicKeys()
	if len(got.Keys) != 2 || len(got.Key(a.ID)) != 1 || len(got.Key(b.ID)) != 1 {
		t.Fatalf("key set %+v, want the keys of tls.key and next.pem", got.Keys)
	}
}

func mustKey(t testing.TB) *cardsig.Key {
	t.Helper()
	k, err := cardsig.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writeKey(t testing.TB, dir, name string, k *cardsig.Key) {
	t.Helper()
	pem, err := k.PEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), pem, 0o600); err != nil {
		t.Fatal(err)
	}
}

// fetchKeySet GETs a jku without credentials.
func fetchKeySet(t testing.TB, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/jwk-set+json" {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body
}
