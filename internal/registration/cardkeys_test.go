package registration

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

func TestKeysOfSecret(t *testing.T) {
	k1, _ := cardsig.NewKey()
	k2, _ := cardsig.NewKey()
	p1, _ := k1.PEM()
	p2, _ := k2.PEM()
	for _, tc := range []struct {
		name    string
		data    map[string][]byte
		want    []string
		wantErr string
	}{
		{"cert-manager's tls.key", map[string][]byte{"tls.key": p1, "tls.crt": []byte("ignored"), "ca.crt": []byte("ignored")}, []string{k1.ID}, ""},
		{"two keys: an overlap, in name order", map[string][]byte{"b.pem": p1, "a.pem": p2}, []string{k2.ID, k1.ID}, ""},
		{"the same key twice signs once", map[string][]byte{"a.pem": p1, "tls.key": p1}, []string{k1.ID}, ""},
		{"no key", map[string][]byte{"readme": []byte("x")}, nil, "no key"},
		{"a broken key", map[string][]byte{"a.pem": p1, "b.pem": []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}, nil, "b.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := keysOf(&corev1.Secret{Data: tc.data})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, k.ID)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("kids %v, want %v", got, tc.want)
			}
		})
	}
}

// signedBy reads who signed a card from the protected headers alone; the ring's id is the same
// set whatever the order.
func TestSignedBy(t *testing.T) {
	k1, _ := cardsig.NewKey()
	k2, _ := cardsig.NewKey()
	card := []byte(`{"name":"x","skills":[]}`)
	both, err := cardsig.Sign(card, "", k2, k1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := signedBy(both), newKeyRing([]*cardsig.Key{k1, k2}).id; got != want {
		t.Fatalf("signedBy = %q, want %q", got, want)
	}
	if got := signedBy(card); got != "" {
		t.Fatalf("unsigned: %q", got)
	}
	if got := signedBy([]byte(`not json`)); got != "" {
		t.Fatalf("garbage: %q", got)
	}
}
