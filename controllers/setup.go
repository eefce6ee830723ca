package controllers

import (
	"cmp"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// Options configure the controllers.
type Options struct {
	// Registrar registers Agents on the broker; nil runs without a broker.
	Registrar Registrar
	// WorkloadBrokerURL is the broker address given to agent workloads (A2A_BROKER); it may differ
	// from the operator's own (e.g. a Service DNS name).
	WorkloadBrokerURL string
	// Gating puts the conversation service in front of every Agent a ConversationPolicy governs
	// (status.topics.delivery, ACLs, workload env). Enable it only where the service runs.
	Gating bool
	// MaxConcurrentReconciles bounds parallel Agent reconciles (broker round trips dominate them);
	// zero means DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int
	// ResyncPeriod is how often a registered Agent is checked against the broker again, which
	// repairs hand-made changes (drift) and notices outages; ±20 % jitter spreads the load.
	// Zero means DefaultResyncPeriod.
	ResyncPeriod time.Duration
}

// DefaultMaxConcurrentReconciles is the Agent reconcile parallelism when unset.
const DefaultMaxConcurrentReconciles = 8

// DefaultResyncPeriod is the broker resync period when Options.ResyncPeriod is zero.
const DefaultResyncPeriod = 10 * time.Minute

// CacheOptions keeps the operator's informers to what it manages: Secrets are cached only when
// they carry the operator's managed-by label, so a cluster with many Secrets costs no memory.
func CacheOptions() cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{identity.LabelManagedBy: identity.ManagedByValue})},
	}}
}

// Setup registers the field indexes and every controller with the manager. The manager binary and
// the integration tests both use it, so the tests exercise exactly what ships.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if err := SetupIndexes(ctx, mgr); err != nil {
		return err
	}
	if err := (&AgentReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("a2a-fleet-agent"),
		Registrar: opts.Registrar,
		Resync:    cmp.Or(opts.ResyncPeriod, DefaultResyncPeriod),

		WorkloadBrokerURL: opts.WorkloadBrokerURL,
		MaxConcurrent:     cmp.Or(opts.MaxConcurrentReconciles, DefaultMaxConcurrentReconciles),
		Gating:            opts.Gating,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up agent controller: %w", err)
	}
	if err := (&ConversationPolicyReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("a2a-fleet-conversationpolicy"),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up conversation policy controller: %w", err)
	}
	return nil
}
