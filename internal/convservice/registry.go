package convservice

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// gatedAgent is one agent the service stands in front of.
type gatedAgent struct {
	ref      a2amqtt.AgentRef
	key      string // "org/unit/agent": the store's agent key
	request  string // public request topic (what requesters publish to)
	delivery string // where accepted requests go
	policy   conversation.Policy
	// policyName is "namespace/name" of the governing ConversationPolicy.
	policyName string
	// agent is the live Agent (the holder of ref) in the cache: read only.
	// Who it admits as caller is the directory's to say.
	agent *a2av1.Agent
}

// registry tracks the gated agents from the Kubernetes API (an informer
// cache on Agents and ConversationPolicies) and keeps one subscription per
// gated agent's request topic. Policy edits take effect on the next request
// without a restart: handlers read the policy at decision time.
type registry struct {
	resyncEvery time.Duration
	log         logr.Logger
	conn        *a2amqtt.Conn
	gauge       prometheus.Gauge
	// consumes says whether this replica subscribes an agent's request topic; onRequest
	// handles what arrives there (both given to serve).
	consumes  func(agent string) bool
	onRequest func(topic string, p *paho.Publish)
	// ownersKick, when set (several replicas), wakes the ownership loop when the agents change.
	ownersKick chan struct{}
	cache      cache.Cache
	// graph is the caller graph over cache (tenancy.CallerGraph), the operator's index.
	graph *tenancy.CallerGraph
	// callers decides who each gated agent admits as caller.
	callers *callerDirectory
	kick    chan struct{}
	stop    context.CancelFunc
	done    chan struct{}

	mu      sync.RWMutex
	byTopic map[string]*gatedAgent
	byKey   map[string]*gatedAgent
	subs    map[string]*a2amqtt.Subscription // by request topic
	// leaving are request topics being unsubscribed by dropStale.
	leaving map[string]bool
}

// registryDeps are what the registry needs from the rest of the replica.
type registryDeps struct {
	cfg        Config
	log        logr.Logger
	conn       *a2amqtt.Conn
	gauge      prometheus.Gauge
	ownersKick chan struct{}
}

// newRegistry starts the Kubernetes cache and returns once it is synced; serve subscribes the
// request topics.
func newRegistry(ctx context.Context, d registryDeps) (*registry, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(a2av1.AddToScheme(scheme))
	utilruntime.Must(corev1.AddToScheme(scheme))
	opts := cache.Options{Scheme: scheme}
	if d.cfg.Namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{d.cfg.Namespace: {}}
	}
	c, err := cache.New(d.cfg.RestConfig, opts)
	if err != nil {
		return nil, fmt.Errorf("conversation service: kubernetes cache: %w", err)
	}
	// Who may call whom and who holds an identity are tenancy's decisions,
	// read through the same indexes as the operator's.
	if err := tenancy.IndexFields(ctx, c); err != nil {
		return nil, fmt.Errorf("conversation service: %w", err)
	}
	// The operator's caller graph, over this cache: Views answer who may call whom from its
	// indexes (namespace labels, AgentGrant consent) as the operator's ACL compiler does.
	graph := tenancy.NewCallerGraph()
	if err := graph.Watch(ctx, c); err != nil {
		return nil, fmt.Errorf("conversation service: caller graph: %w", err)
	}
	r := &registry{
		resyncEvery: d.cfg.ResyncInterval, log: d.log, conn: d.conn, gauge: d.gauge,
		ownersKick: d.ownersKick, cache: c, graph: graph, callers: newCallerDirectory(c), kick: make(chan struct{}, 1), done: make(chan struct{}),
		byTopic: map[string]*gatedAgent{}, byKey: map[string]*gatedAgent{}, subs: map[string]*a2amqtt.Subscription{},
		leaving: map[string]bool{},
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.poke() },
		UpdateFunc: func(any, any) { r.poke() },
		DeleteFunc: func(any) { r.poke() },
	}
	// Tenants, Namespaces and AgentGrants decide who holds an identity and
	// who may call whom (tenancy), so their changes resync as Agents' do.
	for _, obj := range []client.Object{&a2av1.Agent{}, &a2av1.ConversationPolicy{}, &a2av1.Tenant{}, &a2av1.AgentGrant{}, &corev1.Namespace{}} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("conversation service: informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, fmt.Errorf("conversation service: watch %T: %w", obj, err)
		}
	}
	// The graph applies an event in its own handler, maybe after the poke above: a change it
	// reports resyncs again, so the generation's decisions never lag the graph.
	graph.Subscribe(func([]types.NamespacedName) { r.poke() })
	cctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	go func() {
		defer close(r.done)
		if err := c.Start(cctx); err != nil {
			d.log.Error(err, "kubernetes cache stopped")
		}
	}()
	syncCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		stop()
		<-r.done
		return nil, fmt.Errorf("conversation service: kubernetes cache did not sync: %w", syncCtx.Err())
	}
	return r, nil
}

// serve subscribes the request topics of the gated agents this replica consumes, handled by
// onRequest, and keeps them so (resync, run).
func (r *registry) serve(ctx context.Context, consumes func(agent string) bool, onRequest func(topic string, p *paho.Publish)) {
	r.mu.Lock()
	r.consumes, r.onRequest = consumes, onRequest
	r.mu.Unlock()
	r.resync(ctx)
}

// admits reports whether the gated agent callee admits caller (the caller directory).
func (r *registry) admits(ctx context.Context, callee *a2av1.Agent, caller a2amqtt.AgentRef) bool {
	return r.callers.admits(ctx, callee, caller)
}

func (r *registry) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// resyncPauseFactor is how many times a resync's reading of the fleet the registry waits before
// the next resync. That read covers the whole fleet; a burst of watch events (a rollout: three
// writes per new Agent) would otherwise run them back to back, a core's share growing with the
// fleet. The pause bounds the read to 1/(1+factor) of a core in a burst, costs microseconds on a
// small fleet, and the events within it coalesce into the next pass (poke's one-slot channel).
// Only the read counts, never the subscribes and unsubscribes that follow it: those wait on the
// broker (seconds while it restarts), and a pause four times that long would keep a newly gated
// agent, or one whose ownership moved here, unserved for as long. resyncPauseMax bounds the pause
// whatever the fleet.
const (
	resyncPauseFactor = 4
	resyncPauseMax    = time.Second
)

func (r *registry) run(ctx context.Context) {
	t := time.NewTicker(r.resyncEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
		pause := time.NewTimer(min(resyncPauseFactor*r.resync(ctx), resyncPauseMax))
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
	}
}

func (r *registry) close() {
	r.stop()
	<-r.done
}

// desired lists the gated agents from the cache, and renews the caller
// directory with the same view of the objects.
func (r *registry) desired(ctx context.Context) (map[string]*gatedAgent, error) {
	var agents a2av1.AgentList
	// Read-only: no deep copy of the fleet on every resync.
	if err := r.cache.List(ctx, &agents, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	var policies a2av1.ConversationPolicyList
	if err := r.cache.List(ctx, &policies, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list conversation policies: %w", err)
	}
	view, err := (&tenancy.Authorizer{Reader: r.cache, Graph: r.graph}).View(ctx)
	if err != nil {
		return nil, err
	}
	gated, err := r.gatedFrom(ctx, view, agents.Items, policies.Items)
	if err != nil {
		return nil, err
	}
	r.callers.renew(view)
	return gated, nil
}

// gatedFrom is the gated agents, by request topic, that the Agents and
// ConversationPolicies in the cache describe: live Agents only (permitted,
// the holders of their identity), keyed by the identity they hold, never by
// what an Agent that is refused wrote. Its cost is linear in the fleet: it
// runs on every resync.
func (r *registry) gatedFrom(ctx context.Context, view *tenancy.View, agents []a2av1.Agent, policies []a2av1.ConversationPolicy) (map[string]*gatedAgent, error) {
	// Each policy is compiled once, however many agents it governs.
	compiled := make(map[string]conversation.Policy, len(policies))
	for i := range policies {
		p := &policies[i]
		name := p.Namespace + "/" + p.Name
		pol, err := conversation.NewPolicy(&p.Spec)
		if err != nil {
			r.log.Error(err, "invalid conversation policy, using defaults", "policy", name)
			pol = conversation.DefaultPolicy()
		}
		compiled[name] = pol
	}
	out := map[string]*gatedAgent{}
	ceilingsByNamespace := map[string]*a2av1.PolicyCeilings{}
	// Every claimant of every identity is in agents: deciding the holders is
	// linear in the fleet.
	view.PreloadClaimants(agents)
	for i := range agents {
		a := &agents[i]
		if a.Status.Topics == nil || a.Status.Topics.Delivery == "" || a.DeletionTimestamp != nil {
			continue
		}
		live, err := view.Live(ctx, a)
		if err != nil {
			return nil, err
		}
		if !live {
			continue
		}
		ref := identity.Of(a)
		g := &gatedAgent{ref: ref, key: ref.String(), request: ref.RequestTopic(), delivery: identity.DeliveryTopic(ref),
			policy: conversation.DefaultPolicy(), agent: a}
		if name := a.Status.ConversationPolicy; name != "" {
			g.policyName = a.Namespace + "/" + name
			if pol, ok := compiled[g.policyName]; ok {
				g.policy = pol
			}
		}
		// The Tenant's ceilings bound whatever the namespace's policy asks for (the operator
		// reports the excess in the policy's WithinLimits condition).
		ceilings, ok := ceilingsByNamespace[a.Namespace]
		if !ok {
			limits, _, err := view.LimitsFor(ctx, a.Namespace)
			if err != nil {
				return nil, err
			}
			ceilings = limits.ConversationPolicy
			ceilingsByNamespace[a.Namespace] = ceilings
		}
		g.policy, _ = g.policy.Within(ceilings)
		out[g.request] = g
	}
	return out, nil
}

// resync applies the desired set: new agents are subscribed, gone ones
// unsubscribed, policies replaced. A subscription the broker refuses (the
// operator has not granted the gate role yet) is retried on the next pass. It returns
// how long reading the desired set and comparing it took (run's pause).
func (r *registry) resync(ctx context.Context) (read time.Duration) {
	start := time.Now()
	want, err := r.desired(ctx)
	if err != nil {
		r.log.Error(err, "read gated agents")
		return time.Since(start)
	}
	byKey := make(map[string]*gatedAgent, len(want))
	for _, g := range want {
		byKey[g.key] = g
	}
	r.mu.Lock()
	r.byTopic, r.byKey = want, byKey
	var add, remove []string
	for topic, g := range want {
		if r.subs[topic] == nil && r.consumes(g.key) {
			add = append(add, topic)
		}
	}
	for topic := range r.subs {
		if g := want[topic]; g == nil || !r.consumes(g.key) {
			remove = append(remove, topic)
		}
	}
	r.mu.Unlock()
	read = time.Since(start)
	if r.ownersKick != nil {
		// The set of gated agents may have changed: rebalance ownership.
		select {
		case r.ownersKick <- struct{}{}:
		default:
		}
	}

	for _, topic := range remove {
		r.mu.Lock()
		sub := r.subs[topic]
		delete(r.subs, topic)
		r.mu.Unlock()
		if err := sub.Close(ctx); err != nil {
			r.log.Error(err, "unsubscribe agent that is no longer gated", "topic", topic)
		} else {
			r.log.Info("stopped consuming request topic", "topic", topic)
		}
	}
	for _, topic := range add {
		topic := topic
		sub, err := r.conn.Subscribe(ctx, topic, func(p *paho.Publish) { r.onRequest(topic, p) })
		if err != nil {
			r.log.Info("cannot consume request topic yet, will retry", "topic", topic, "err", err.Error())
			continue
		}
		r.mu.Lock()
		r.subs[topic] = sub
		r.mu.Unlock()
		r.log.Info("consuming request topic", "topic", topic, "agent", want[topic].key, "policy", want[topic].policyName)
	}
	r.mu.RLock()
	r.gauge.Set(float64(len(r.subs)))
	r.mu.RUnlock()
	return read
}

// dropStale unsubscribes a request topic this replica received a request on
// without consuming it: a subscription its persistent session kept from a
// previous run (the agent moved to another replica while this one was
// down). The broker has no other way to forget it until the session expires.
func (r *registry) dropStale(topic string) {
	r.mu.Lock()
	if r.subs[topic] != nil || r.leaving[topic] {
		r.mu.Unlock()
		return
	}
	r.leaving[topic] = true
	r.mu.Unlock()
	go func() {
		defer func() {
			r.mu.Lock()
			delete(r.leaving, topic)
			r.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Conn has no bare unsubscribe: take a handler and give it back,
		// which unsubscribes unless the registry subscribed the topic
		// meanwhile (then its handler keeps the subscription).
		sub, err := r.conn.Subscribe(ctx, topic, func(*paho.Publish) {})
		if err == nil {
			err = sub.Close(ctx)
		}
		if err != nil {
			r.log.Info("cannot drop a stale request subscription", "topic", topic, "err", err.Error())
			return
		}
		r.log.Info("dropped a request subscription left from a previous run", "topic", topic)
	}()
}

// keys lists the gated agents ("org/unit/agent").
func (r *registry) keys() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.byKey))
	for k := range r.byKey {
		out = append(out, k)
	}
	return out
}

func (r *registry) byRequestTopic(topic string) *gatedAgent {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byTopic[topic]
}

func (r *registry) agent(key string) *gatedAgent {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byKey[key]
}

// policyOf returns the policy of an agent; an agent that is no longer gated
// keeps the defaults so its stored contexts still expire.
func (r *registry) policyOf(key string) conversation.Policy {
	if g := r.agent(key); g != nil {
		return g.policy
	}
	return conversation.DefaultPolicy()
}

func (r *registry) subscribed() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for topic := range r.subs {
		if g := r.byTopic[topic]; g != nil {
			out = append(out, g.key)
		}
	}
	slices.Sort(out)
	return out
}
