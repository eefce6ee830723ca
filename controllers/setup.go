package controllers

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Options configure the controllers.
type Options struct {
	// Registrar registers Agents on the broker; nil runs without a broker.
	Registrar Registrar
}

// Setup registers the field indexes and every controller with the manager. The manager binary and
// the integration tests both use it, so the tests exercise exactly what ships.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if err := SetupIndexes(ctx, mgr); err != nil {
		return err
	}
	if err := (&AgentReconciler{
		Client:    mgr.GetClient(),
		Recorder:  mgr.GetEventRecorder("a2a-fleet-agent"),
		Registrar: opts.Registrar,
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
