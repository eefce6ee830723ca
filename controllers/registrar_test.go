package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

// recordingRegistrar stands in for the broker at the controllers.Registrar seam. It proves the
// controller's side of the contract (when Register/Unregister are called and how failures surface);
// the broker implementations are tested against real brokers in their own packages.
type recordingRegistrar struct {
	mu           sync.Mutex
	registered   map[string]int // client ID -> Register calls
	unregistered map[string]int
	passwordsSet map[string][]string // client ID -> passwords pushed to the "broker"
	shared       map[string][]string // shared key -> client IDs of the last ApplyShared
	failing      bool
}

func newRecordingRegistrar() *recordingRegistrar {
	return &recordingRegistrar{registered: map[string]int{}, unregistered: map[string]int{}, passwordsSet: map[string][]string{}, shared: map[string][]string{}}
}

func (r *recordingRegistrar) Register(_ context.Context, a *a2av1.Agent, creds registration.Credentials) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		return errors.New("dial tcp 127.0.0.1:1883: connect: connection refused")
	}
	if creds.Password == "" || creds.ClientID != a.Status.ClientID {
		return errors.New("registrar got no credentials for " + a.Status.ClientID)
	}
	if creds.PasswordChanged {
		r.passwordsSet[a.Status.ClientID] = append(r.passwordsSet[a.Status.ClientID], creds.Password)
	}
	r.registered[a.Status.ClientID]++
	// Like the real registrar: record the card published for this generation.
	a.Status.PublishedCardDigest = fmt.Sprintf("card-of-generation-%d", a.Generation)
	return nil
}

func (r *recordingRegistrar) Unregister(_ context.Context, a *a2av1.Agent) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		return errors.New("dial tcp 127.0.0.1:1883: connect: connection refused")
	}
	r.unregistered[a.Status.ClientID]++
	return nil
}

func (r *recordingRegistrar) ApplyShared(_ context.Context, key registration.SharedKey, members []registration.Member) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		return errors.New("dial tcp 127.0.0.1:1883: connect: connection refused")
	}
	ids := []string{}
	for _, m := range members {
		ids = append(ids, m.Agent.ClientID())
	}
	r.shared[key.String()] = ids
	return nil
}

func (r *recordingRegistrar) setFailing(f bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = f
}

func (r *recordingRegistrar) passwords(clientID string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.passwordsSet[clientID]...)
}

func (r *recordingRegistrar) counts(clientID string) (registered, unregistered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered[clientID], r.unregistered[clientID]
}
