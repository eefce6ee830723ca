package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// JWKSPath is where the gateway serves the public keys that sign agent cards (the JWK Set the
// operator retains on a2amqtt.CardKeysTopic), for the `jku` of the cards' signatures: the
// operator's --card-keys-url names {gateway}/.well-known/jwks.json.
const JWKSPath = "/.well-known/jwks.json"

// jwksCacheTTL is how long a key set read from the bus is served without reading it again: a
// rotation's overlap window (docs/security.md) is far longer.
const jwksCacheTTL = 10 * time.Second

// jwksCache keeps the last key set read.
type jwksCache struct {
	mu      sync.Mutex
	body    []byte
	expires time.Time
}

// serveJWKS answers with the key set retained on the bus, read over the connection of
// InboundConfig.CardKeysAgent (an Agent of the fleet: every identity may read the key set, only
// the operator may write it), and the public keys of the gateway's own CardSigner, which sign the
// cards it serves. Public: a client fetching a jku presents no credentials, and the keys are
// public.
func (in *Inbound) serveJWKS(w http.ResponseWriter, r *http.Request) {
	if in.cfg.CardKeysAgent.Name == "" && in.cfg.CardSigner == nil {
		http.Error(w, "this gateway serves no card keys (--card-keys-agent, --card-signing-dir)", http.StatusNotFound)
		return
	}
	set := jose.JSONWebKeySet{}
	if in.cfg.CardKeysAgent.Name != "" {
		bus, ok := in.busKeys(w, r)
		if !ok {
			return
		}
		set.Keys = append(set.Keys, bus.Keys...)
	}
	if in.cfg.CardSigner != nil {
		for _, k := range in.cfg.CardSigner.PublicKeys().Keys {
			if len(set.Key(k.KeyID)) == 0 {
				set.Keys = append(set.Keys, k)
			}
		}
	}
	body, err := json.Marshal(set)
	if err != nil {
		http.Error(w, "cannot encode the card keys", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(jwksCacheTTL/time.Second)))
	_, _ = w.Write(body)
}

// busKeys is the key set retained on the bus (cached for jwksCacheTTL); when it is not ok it
// has answered (an error, or the request forwarded to the replica that serves the keys agent).
func (in *Inbound) busKeys(w http.ResponseWriter, r *http.Request) (jose.JSONWebKeySet, bool) {
	in.jwks.mu.Lock()
	body, fresh := in.jwks.body, time.Now().Before(in.jwks.expires)
	in.jwks.mu.Unlock()
	if !fresh {
		ag := &a2av1.Agent{}
		if err := in.cfg.Directory.Reader.Get(r.Context(), in.cfg.CardKeysAgent, ag); err != nil || !holds(ag) {
			in.cfg.Logger.Error("card keys agent", "agent", in.cfg.CardKeysAgent.String(), "err", err)
			http.Error(w, "the card keys agent holds no identity", http.StatusServiceUnavailable)
			return jose.JSONWebKeySet{}, false
		}
		if in.cfg.Ring != nil && r.Header.Get(ForwardedHeader) == "" {
			if owner := in.cfg.Ring.Owner(identity.Of(ag).ClientID()); owner.ID != in.cfg.Ring.Self() {
				in.forward(w, r, owner)
				return jose.JSONWebKeySet{}, false
			}
		}
		b, err := in.readKeys(r.Context(), ag)
		if err != nil {
			in.cfg.Logger.Error("read card keys", "err", err)
			http.Error(w, "cannot read the card keys now", http.StatusServiceUnavailable)
			return jose.JSONWebKeySet{}, false
		}
		body = b
		in.jwks.mu.Lock()
		in.jwks.body, in.jwks.expires = body, time.Now().Add(jwksCacheTTL)
		in.jwks.mu.Unlock()
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(body, &set); err != nil {
		http.Error(w, "the bus's card keys are not a key set", http.StatusServiceUnavailable)
		return jose.JSONWebKeySet{}, false
	}
	return set, true
}

// readKeys reads the retained key set once, over ag's pooled connection.
func (in *Inbound) readKeys(ctx context.Context, ag *a2av1.Agent) ([]byte, error) {
	req, release, err := in.cfg.Pool.Requester(ctx, ag)
	if err != nil {
		return nil, err
	}
	defer release()
	trust, err := a2amqtt.FollowCardKeys(ctx, req.Conn(), 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer func() { _ = trust.Close(context.WithoutCancel(ctx)) }()
	return json.Marshal(trust.Keys())
}
