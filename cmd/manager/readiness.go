package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// addBrokerReadiness makes /readyz say whether the operator can administer the broker: it fails
// once no broker round trip has succeeded for longer than grace (and until the first one has).
// grace 0 leaves readiness to the manager alone.
func addBrokerReadiness(mgr ctrl.Manager, backend acl.Backend, grace time.Duration) error {
	if grace <= 0 {
		return mgr.AddReadyzCheck("readyz", func(*http.Request) error { return nil })
	}
	p := &brokerProbe{backend: backend, grace: grace, interval: min(max(grace/3, time.Second), 10*time.Second)}
	if err := mgr.Add(p); err != nil {
		return fmt.Errorf("add broker probe: %w", err)
	}
	if err := mgr.AddReadyzCheck("broker", p.check); err != nil {
		return fmt.Errorf("add broker ready check: %w", err)
	}
	return nil
}

// brokerProbe reads the operator's own broker identity every interval through the admin
// connection, on every replica (followers too: their readiness must not wait for leadership).
// A broker round trip is what registration needs, so it is what readiness measures.
type brokerProbe struct {
	backend         acl.Backend
	grace, interval time.Duration

	mu      sync.Mutex
	lastOK  time.Time
	lastErr error
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (p *brokerProbe) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (p *brokerProbe) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("broker-readiness")
	wasOK := true
	for {
		pctx, cancel := context.WithTimeout(ctx, max(p.interval, 5*time.Second))
		_, err := p.backend.Observe(pctx, &acl.Names{Clients: []string{identity.OperatorUsername}})
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		p.mu.Lock()
		if err == nil {
			p.lastOK, p.lastErr = time.Now(), nil
		} else {
			p.lastErr = err
		}
		p.mu.Unlock()
		// Transitions only, at Info: a broker restart is expected and the operator recovers.
		switch {
		case err == nil && !wasOK:
			log.Info("broker reachable")
		case err != nil && wasOK:
			log.Info("broker unreachable; retrying", "err", err.Error())
		}
		wasOK = err == nil
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(p.interval):
		}
	}
}

func (p *brokerProbe) check(*http.Request) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.lastOK.IsZero() && p.lastErr == nil:
		return errors.New("broker not reached yet")
	case p.lastOK.IsZero():
		return fmt.Errorf("broker not reached yet: %w", p.lastErr)
	case time.Since(p.lastOK) > p.grace && p.lastErr != nil:
		return fmt.Errorf("broker unreachable for %s: %w", time.Since(p.lastOK).Round(time.Second), p.lastErr)
	case time.Since(p.lastOK) > p.grace:
		return fmt.Errorf("no answer from the broker for %s", time.Since(p.lastOK).Round(time.Second))
	}
	return nil
}
