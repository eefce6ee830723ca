package main

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// The gateway's signing Secret is created once with one parseable key and kept as it is after.
func TestGatewayCardKeysCreatesTheSecretOnce(t *testing.T) {
	c := fake.NewClientBuilder().Build()
	r, err := gatewayCardKeys("a2a-fleet-system/a2a-fleet-gateway-card-signing", c, c)
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: "a2a-fleet-system", Name: "a2a-fleet-gateway-card-signing"}
	read := func() map[string][]byte {
		t.Helper()
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{}
		if err := c.Get(context.Background(), key, s); err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	first := read()
	if len(first) != 1 {
		t.Fatalf("want one key entry, got %d", len(first))
	}
	for name, pemBytes := range first {
		if _, err := cardsig.ParseKeyPEM(pemBytes); err != nil {
			t.Fatalf("entry %s is no signing key: %v", name, err)
		}
	}
	second := read()
	for name, v := range first {
		if string(second[name]) != string(v) {
			t.Fatal("a second start replaced the key")
		}
	}
	if _, err := gatewayCardKeys("no-slash", c, c); err == nil {
		t.Fatal("a flag without NAMESPACE/NAME was taken")
	}
}
