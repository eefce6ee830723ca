package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Errors of the identity mapping; the HTTP layer turns them into status codes.
var (
	// ErrNoAgentForCaller: no Agent lists the caller's ServiceAccount in spec.http.serviceAccounts.
	ErrNoAgentForCaller = errors.New("no Agent lists this ServiceAccount in spec.http.serviceAccounts")
	// ErrAmbiguousCaller: several Agents list it; the mapping must name one identity.
	ErrAmbiguousCaller = errors.New("several Agents list this ServiceAccount in spec.http.serviceAccounts")
	// ErrNotExposed: the target agent does not exist, holds no identity or is not exposed over HTTP.
	ErrNotExposed = errors.New("no such agent exposed over HTTP")
)

// IndexAgentHTTPServiceAccount indexes Agents by each ServiceAccount of spec.http.serviceAccounts
// ("{namespace}/{name}").
const IndexAgentHTTPServiceAccount = "a2a.fleet.dev/http-service-account"

// Directory reads what the gateway needs from the API server: which Agent a ServiceAccount acts
// as, which agents are exposed or served over HTTP, and an Agent's broker credentials. It keeps
// nothing itself: its Reader is NewCachedReader's, whose informer cache and indexes
// (identity.IndexAgentClientID, IndexAgentHTTPServiceAccount) make a lookup cost no request and
// no scan of every Agent.
type Directory struct {
	Reader client.Reader
	// Namespace, when set, limits the gateway to one namespace; "" reads every namespace.
	Namespace string
	// MemoTTL is how long a found caller or target Agent is reused without a lookup (default
	// DefaultMemoTTL; negative: look up every time). A lookup in the informer cache costs a REST
	// mapping and an index read, about a third of the gateway's own CPU per call; a mapping
	// removed from an Agent stops admitting within MemoTTL (a refusal is never remembered).
	MemoTTL time.Duration

	memo memo
}

// DefaultMemoTTL is Directory's default MemoTTL.
const DefaultMemoTTL = time.Second

// maxMemoEntries bounds each memo map; past it, the map is emptied.
const maxMemoEntries = 10000

// memo keeps the Agents found recently, by lookup key.
type memo struct {
	mu      sync.Mutex
	entries map[string]memoEntry
}

type memoEntry struct {
	agent   *a2av1.Agent
	expires time.Time
}

func (d *Directory) memoTTL() time.Duration {
	if d.MemoTTL == 0 {
		return DefaultMemoTTL
	}
	return d.MemoTTL
}

func (d *Directory) recall(key string, now time.Time) *a2av1.Agent {
	d.memo.mu.Lock()
	defer d.memo.mu.Unlock()
	e, ok := d.memo.entries[key]
	if !ok || now.After(e.expires) {
		return nil
	}
	return e.agent
}

func (d *Directory) remember(key string, ag *a2av1.Agent, now time.Time) {
	ttl := d.memoTTL()
	if ttl < 0 {
		return
	}
	d.memo.mu.Lock()
	defer d.memo.mu.Unlock()
	if d.memo.entries == nil || len(d.memo.entries) >= maxMemoEntries {
		d.memo.entries = map[string]memoEntry{}
	}
	d.memo.entries[key] = memoEntry{agent: ag, expires: now.Add(ttl)}
}

// holds reports whether the Agent holds its identity: the operator sets status.clientID only for
// the holder of a permitted identity (docs/security.md, "One holder per identity").
func holds(ag *a2av1.Agent) bool {
	return ag.Status.ClientID != "" && ag.Status.ClientID == identity.Of(ag).ClientID()
}

// CallerAgent returns the Agent that ServiceAccount ns/name acts as.
func (d *Directory) CallerAgent(ctx context.Context, ns, name string) (*a2av1.Agent, error) {
	if d.Namespace != "" && ns != d.Namespace {
		return nil, ErrNoAgentForCaller
	}
	key, now := "caller\x00"+ns+"/"+name, time.Now()
	if ag := d.recall(key, now); ag != nil {
		return ag, nil
	}
	ag, err := d.lookupCaller(ctx, ns, name)
	if err == nil {
		d.remember(key, ag, now)
	}
	return ag, err
}

func (d *Directory) lookupCaller(ctx context.Context, ns, name string) (*a2av1.Agent, error) {
	var list a2av1.AgentList
	// Read-only: the cache's objects are not copied (the gateway never modifies an Agent).
	if err := d.Reader.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy,
		client.MatchingFields{IndexAgentHTTPServiceAccount: ns + "/" + name}); err != nil {
		return nil, fmt.Errorf("list agents in %s: %w", ns, err)
	}
	var found *a2av1.Agent
	for i := range list.Items {
		ag := &list.Items[i]
		if ag.Spec.HTTP == nil || !slices.Contains(ag.Spec.HTTP.ServiceAccounts, name) || !holds(ag) {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("%w: %s and %s", ErrAmbiguousCaller, found.Name, ag.Name)
		}
		found = ag
	}
	if found == nil {
		return nil, ErrNoAgentForCaller
	}
	return found, nil
}

// agents lists the Agents the gateway may see (and that match opts).
func (d *Directory) agents(ctx context.Context, more ...client.ListOption) ([]a2av1.Agent, error) {
	var list a2av1.AgentList
	opts := append([]client.ListOption{client.UnsafeDisableDeepCopy}, more...)
	if d.Namespace != "" {
		opts = append(opts, client.InNamespace(d.Namespace))
	}
	if err := d.Reader.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return list.Items, nil
}

// ExposedAgent returns the holder of identity ref when it is exposed over HTTP.
func (d *Directory) ExposedAgent(ctx context.Context, ref a2amqtt.AgentRef) (*a2av1.Agent, error) {
	key, now := "target\x00"+ref.ClientID(), time.Now()
	if ag := d.recall(key, now); ag != nil {
		return ag, nil
	}
	ag, err := d.lookupExposed(ctx, ref)
	if err == nil {
		d.remember(key, ag, now)
	}
	return ag, err
}

func (d *Directory) lookupExposed(ctx context.Context, ref a2amqtt.AgentRef) (*a2av1.Agent, error) {
	items, err := d.agents(ctx, client.MatchingFields{identity.IndexAgentClientID: ref.ClientID()})
	if err != nil {
		return nil, err
	}
	for i := range items {
		ag := &items[i]
		if identity.Of(ag) == ref && holds(ag) && ag.Spec.HTTP != nil && ag.Spec.HTTP.Expose {
			return ag, nil
		}
	}
	return nil, ErrNotExposed
}

// HTTPAgents returns the Agents whose workload is an HTTP A2A server (spec.http.url) and that hold
// their identity: the ones the gateway stands in for on the bus.
func (d *Directory) HTTPAgents(ctx context.Context) ([]a2av1.Agent, error) {
	items, err := d.agents(ctx)
	if err != nil {
		return nil, err
	}
	var out []a2av1.Agent
	for _, ag := range items {
		if ag.Spec.HTTP != nil && ag.Spec.HTTP.URL != "" && holds(&ag) && ag.Status.CredentialsSecret != "" {
			out = append(out, ag)
		}
	}
	return out, nil
}

// secretCredentials reads an Agent's broker credentials from its Secret at every CONNECT
// attempt, so a rotated password is used at the next reconnect (a2amqtt.CredentialSource).
type secretCredentials struct {
	ctx    context.Context
	reader client.Reader
	key    client.ObjectKey
}

// Credentials implements a2amqtt.CredentialSource.
func (s secretCredentials) Credentials() (string, []byte, error) {
	var sec corev1.Secret
	if err := s.reader.Get(s.ctx, s.key, &sec); err != nil {
		return "", nil, fmt.Errorf("read credentials secret %s: %w", s.key, err)
	}
	user, pass := sec.Data[a2amqtt.CredentialsFileUsername], sec.Data[a2amqtt.CredentialsFilePassword]
	if len(user) == 0 || len(pass) == 0 {
		return "", nil, fmt.Errorf("credentials secret %s has no username or password", s.key)
	}
	return string(user), pass, nil
}

// Credentials returns the CredentialSource of an Agent's broker credentials.
func (d *Directory) Credentials(ctx context.Context, ag *a2av1.Agent) (a2amqtt.CredentialSource, error) {
	if ag.Status.CredentialsSecret == "" {
		return nil, fmt.Errorf("agent %s/%s has no credentials secret yet", ag.Namespace, ag.Name)
	}
	return secretCredentials{ctx: ctx, reader: d.Reader, key: client.ObjectKey{Namespace: ag.Namespace, Name: ag.Status.CredentialsSecret}}, nil
}

// NewCachedReader returns the reader a gateway runs with: Agents from an informer cache (every
// request reads them, so a lookup costs no request to the API server), Secrets read directly when
// a connection is made (the gateway needs no list or watch on Secrets). The cache runs until ctx
// ends; NewCachedReader returns once it has synced.
func NewCachedReader(ctx context.Context, cfg *rest.Config, namespace string) (client.Reader, error) {
	opts := cache.Options{Scheme: NewScheme()}
	if namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	agents, err := cache.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("agent cache: %w", err)
	}
	if err := agents.IndexField(ctx, &a2av1.Agent{}, identity.IndexAgentClientID, func(o client.Object) []string {
		return []string{identity.Of(o.(*a2av1.Agent)).ClientID()}
	}); err != nil {
		return nil, fmt.Errorf("index agents by client ID: %w", err)
	}
	if err := agents.IndexField(ctx, &a2av1.Agent{}, IndexAgentHTTPServiceAccount, func(o client.Object) []string {
		ag := o.(*a2av1.Agent)
		if ag.Spec.HTTP == nil {
			return nil
		}
		keys := make([]string, 0, len(ag.Spec.HTTP.ServiceAccounts))
		for _, sa := range ag.Spec.HTTP.ServiceAccounts {
			keys = append(keys, ag.Namespace+"/"+sa)
		}
		return keys
	}); err != nil {
		return nil, fmt.Errorf("index agents by HTTP ServiceAccount: %w", err)
	}
	reader, err := client.New(cfg, client.Options{Scheme: opts.Scheme,
		Cache: &client.CacheOptions{Reader: agents, DisableFor: []client.Object{&corev1.Secret{}}}})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	go func() { _ = agents.Start(ctx) }()
	if !agents.WaitForCacheSync(ctx) {
		return nil, errors.New("agent cache did not sync")
	}
	return reader, nil
}

// NewScheme holds the types the gateway reads: Agents and Secrets (and the rest of client-go's).
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(a2av1.AddToScheme(s))
	return s
}
