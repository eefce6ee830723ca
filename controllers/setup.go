package controllers

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	psaapi "k8s.io/pod-security-admission/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// Options configure the controllers.
type Options struct {
	// Registrar registers Agents on the broker; nil runs without a broker.
	Registrar Registrar
	// WorkloadBrokerURL is the broker address given to agent workloads (A2A_BROKER); it may differ
	// from the operator's own (e.g. a Service DNS name).
	WorkloadBrokerURL string
	// WorkloadBrokerCAFile, when set, names the PEM CA bundle that verifies WorkloadBrokerURL: every
	// Agent's credentials Secret carries it (key ca.crt, re-read from the file at each reconcile, so
	// a rotated CA is written without a new password or a pod roll), and the workloads get
	// A2A_TLS_CA naming it in their mounted Secret. Empty: no CA (the system roots, or plain MQTT).
	// The file is also polled every WorkloadBrokerCAPoll (zero: DefaultWorkloadCAPoll): a new CA
	// is written into every credentials Secret at once, not only at each Agent's next reconcile.
	WorkloadBrokerCAFile string
	WorkloadBrokerCAPoll time.Duration
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
	// WorkloadSecurityFloor is the lowest Pod Security level (privileged, baseline, restricted)
	// an Agent workload is checked at, whatever its namespace's enforce label says; empty means
	// baseline.
	WorkloadSecurityFloor string
	// AgentResyncs, when set, is the broker runtime's stream of Agents to reconcile again because
	// the broker lost its state (registration.Broker.AgentResyncs): their own and their shared
	// broker objects are re-created at once instead of at the next resync.
	AgentResyncs <-chan event.TypedGenericEvent[client.Object]
	// Presence, when set, gives every Agent a Connected condition (registration.Broker); and
	// PresenceEvents (registration.Broker.PresenceEvents) reconciles an Agent when its process
	// connects or goes.
	Presence       PresenceReader
	PresenceEvents <-chan event.TypedGenericEvent[client.Object]
	// PoolsUnsupported, when set, says why the broker cannot deliver a pool's requests (the
	// binaries set it for Mosquitto: PoolsUnsupportedOnMosquitto): an Agent with a poolID then
	// goes Ready=False with reason PoolUnsupportedByBroker and a Warning Event instead of a Ready
	// that no request would reach.
	PoolsUnsupported string
	// Metrics, when set, receives the operator's metrics (metrics.go): Agents and
	// ConversationPolicies by condition, broker commands with their latency and failures,
	// credential rotations. The binaries pass controller-runtime's registry; nil: none.
	Metrics prometheus.Registerer
	// CallerGraph, when set, is the caller graph Setup keeps from the manager's Agent informer
	// and the controllers read; the binary shares it with the Registrar's reader
	// (tenancy.WithCallerGraph). Nil: Setup makes its own.
	CallerGraph *tenancy.CallerGraph
	// AgentCounts, when set, is the Agent count and order index Setup's reads use (Tenant
	// limits); the binary shares it with the Registrar's reader, so that both decide from one
	// index. Nil: Setup makes its own.
	AgentCounts *tenancy.AgentCounts
}

// PoolsUnsupportedOnMosquitto is Options.PoolsUnsupported for a Mosquitto broker (docs/broker.md).
const PoolsUnsupportedOnMosquitto = "Mosquitto 2.0 never delivers topics starting with $ to shared subscriptions, so no request to the pool reaches its members (docs/broker.md)"

// BindFlags registers the flags of the options that belong to the controllers themselves (the
// broker and leader-election flags are the binary's).
func (o *Options) BindFlags(fs *flag.FlagSet) {
	o.WorkloadSecurityFloor = string(DefaultWorkloadSecurityFloor)
	fs.Var(securityFloorFlag{&o.WorkloadSecurityFloor}, "workload-security-floor",
		"Lowest Pod Security `level` (privileged, baseline, restricted) Agent workloads are checked at; a namespace's pod-security.kubernetes.io/enforce label can only raise it.")
	fs.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", DefaultMaxConcurrentReconciles, "Agents reconciled in parallel.")
}

// securityFloorFlag refuses a level that is not a Pod Security level when the flag is parsed
// (with the usage), not later when the controllers are set up.
type securityFloorFlag struct{ level *string }

func (f securityFloorFlag) String() string {
	if f.level == nil {
		return ""
	}
	return *f.level
}

func (f securityFloorFlag) Set(v string) error {
	if level := psaapi.Level(v); !level.Valid() {
		return fmt.Errorf("%q is not a Pod Security level (privileged, baseline, restricted)", v)
	}
	*f.level = v
	return nil
}

// DefaultMaxConcurrentReconciles is the Agent reconcile parallelism when unset.
const DefaultMaxConcurrentReconciles = 8

// DefaultResyncPeriod is the broker resync period when Options.ResyncPeriod is zero.
const DefaultResyncPeriod = 10 * time.Minute

// CacheOptions keeps the operator's informers to what it manages: Secrets and Deployments are
// cached only when they carry the operator's managed-by label, so a cluster with many of them
// costs no memory. (The controllers read around the cache, through the API reader, before they
// create one, so a foreign object with the same name is never overwritten.) No cached object
// keeps its managedFields, which the operator never reads (a third of a small object's size).
func CacheOptions() cache.Options {
	managed := labels.SelectorFromSet(labels.Set{identity.LabelManagedBy: identity.ManagedByValue})
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:     {Label: managed},
			&appsv1.Deployment{}: {Label: managed},
		},
	}
}

// Setup registers the field indexes and every controller with the manager. The manager binary and
// the integration tests both use it, so the tests exercise exactly what ships.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if err := SetupIndexes(ctx, mgr); err != nil {
		return err
	}
	workloads, err := NewWorkloadPolicy(psaapi.Level(opts.WorkloadSecurityFloor))
	if err != nil {
		return err
	}
	resync := cmp.Or(opts.ResyncPeriod, DefaultResyncPeriod)
	// The reconcilers' reads count a Tenant's Agents, and place an Agent among them for its
	// maxAgents, from an informer-kept index instead of listing them all in every reconcile
	// (tenancy.AgentCounts).
	counts := opts.AgentCounts
	if counts == nil {
		counts = tenancy.NewAgentCounts(mgr.GetCache())
	}
	c := tenancy.WithAgentCounts(mgr.GetClient(), counts)
	// Their caller relations come from one caller graph, kept by the Agent informer.
	graph := opts.CallerGraph
	if graph == nil {
		graph = tenancy.NewCallerGraph()
	}
	if err := graph.Watch(ctx, mgr.GetCache()); err != nil {
		return err
	}
	c = tenancy.WithCallerGraph(c, graph)
	var m *metrics
	if opts.Metrics != nil {
		if m, err = newMetrics(opts.Metrics, mgr.GetCache()); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
		if opts.Registrar != nil {
			opts.Registrar = instrumentedRegistrar{Registrar: opts.Registrar, m: m}
		}
	}
	var tracker *SharedTracker
	if opts.Registrar != nil {
		tracker = NewSharedTracker()
		if err := (&SharedReconciler{
			Client: c, Registrar: opts.Registrar, Tracker: tracker, Gating: opts.Gating, Resync: resync,
		}).SetupWithManager(mgr, 4); err != nil {
			return fmt.Errorf("set up shared ACL controller: %w", err)
		}
	}
	var resyncs *brokerResyncs
	if opts.AgentResyncs != nil {
		resyncs = newBrokerResyncs(opts.AgentResyncs, tracker, opts.Gating, mgr.GetClient())
		if err := mgr.Add(resyncs); err != nil {
			return fmt.Errorf("add broker resync stream: %w", err)
		}
	}
	if err := (&AgentReconciler{
		Client:    c,
		Resyncs:   resyncs,
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("a2a-fleet-agent"),
		Registrar: opts.Registrar,
		Shared:    tracker,
		Resync:    resync,
		Workloads: workloads,

		WorkloadBrokerURL:    opts.WorkloadBrokerURL,
		WorkloadBrokerCAFile: opts.WorkloadBrokerCAFile,
		MaxConcurrent:        cmp.Or(opts.MaxConcurrentReconciles, DefaultMaxConcurrentReconciles),
		Gating:               opts.Gating,
		Presence:             opts.Presence,
		PresenceEvents:       opts.PresenceEvents,
		PoolsUnsupported:     opts.PoolsUnsupported,
		Graph:                graph,
		Counts:               counts,
		metrics:              m,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up agent controller: %w", err)
	}
	if opts.WorkloadBrokerCAFile != "" {
		if err := mgr.Add(&workloadCAWatch{ca: newWorkloadCA(opts.WorkloadBrokerCAFile), client: mgr.GetClient(),
			period: cmp.Or(opts.WorkloadBrokerCAPoll, DefaultWorkloadCAPoll)}); err != nil {
			return fmt.Errorf("add workload broker CA watch: %w", err)
		}
	}
	if err := (&TenantReconciler{
		Client:   c,
		Recorder: mgr.GetEventRecorder("a2a-fleet-tenant"),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up tenant controller: %w", err)
	}
	if err := (&ConversationPolicyReconciler{
		Client:   c,
		Recorder: mgr.GetEventRecorder("a2a-fleet-conversationpolicy"),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up conversation policy controller: %w", err)
	}
	return nil
}
