package gateway

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The profile gives each identity one MQTT client ID, and the operator pins it in the broker
// (a username connects with exactly its own client ID): two gateway replicas connecting as the
// same Agent would take the session from each other in turn. The ring makes each identity the
// gateway stands in for (an HTTP caller's, an HTTP agent's) the business of exactly one replica:
// every replica keeps a Kubernetes Lease naming itself and its address, reads the others', and
// assigns each identity by rendezvous hashing over the live replicas. A replica holds only the
// HTTP agents assigned to it and forwards an HTTP request to the replica assigned its caller.

// Labels and annotations of a ring's Leases.
const (
	// RingLabel carries the ring's name on each replica's Lease (one ring per gateway install).
	RingLabel = "a2a.fleet.dev/gateway-ring"
	// AddressAnnotation is the replica's HTTP address as the other replicas reach it.
	AddressAnnotation = "a2a.fleet.dev/gateway-address"
)

// RingConfig configures a replica's place in the ring.
type RingConfig struct {
	// Client reads and writes the Leases (coordination.k8s.io) of Namespace.
	Client    client.Client
	Namespace string
	// Name is the ring's name (one per install; the Leases are named "{Name}-{ReplicaID}").
	Name string
	// ReplicaID names this replica (the pod's name).
	ReplicaID string
	// Address is this replica's HTTP base URL as the other replicas reach it (the pod IP).
	Address string
	// TTL is how long a replica that stopped renewing stays a member (default 10s): the take-over
	// time after a crash. A replica that stops cleanly leaves at once.
	TTL time.Duration
	// Interval is how often the Leases are read (default 1s): the take-over time after a clean
	// stop. The own Lease is renewed every TTL/3.
	Interval time.Duration
	Logger   *slog.Logger
}

// Member is a live replica.
type Member struct {
	ID, Address string
}

// Ring is this replica's view of the live replicas.
type Ring struct {
	cfg RingConfig

	mu        sync.Mutex
	members   []Member // sorted by ID; always includes this replica
	renewed   time.Time
	listeners []func()
	// readAt is when the last successful read of the Leases began (zero before the first):
	// the members are at least as recent as that moment. readDone is closed and replaced at
	// every successful read, waking those that wait for a fresh view (OwnsAfterRead).
	readAt   time.Time
	readDone chan struct{}
}

// NewRing returns a ring in which only this replica is live until Run reads the Leases.
func NewRing(cfg RingConfig) *Ring {
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Name == "" {
		cfg.Name = "a2a-gateway"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Ring{cfg: cfg, members: []Member{{ID: cfg.ReplicaID, Address: cfg.Address}}, readDone: make(chan struct{})}
}

// Ready reports whether the Leases have been read at least once. Until then this replica sees
// only itself and would claim every identity, including those another replica holds: nothing
// is held on the ring's word before it is ready.
func (r *Ring) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.readAt.IsZero()
}

// OwnsAfterRead reports whether this replica is assigned key in a view of the Leases read after
// the call began: it waits (bounded by ctx) for the next successful read. A connection that was
// taken over asks it before connecting again, so it never acts on the view it had before the
// takeover (another replica may have joined since).
func (r *Ring) OwnsAfterRead(ctx context.Context, key string) (bool, error) {
	since := time.Now()
	for {
		r.mu.Lock()
		fresh, done := !r.readAt.Before(since), r.readDone
		r.mu.Unlock()
		if fresh {
			return r.Owns(key), nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return false, fmt.Errorf("wait for a fresh view of the gateway replicas: %w", ctx.Err())
		}
	}
}

// OnChange registers f, called (from Run's goroutine) whenever the live set changes.
func (r *Ring) OnChange(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, f)
}

// Self is this replica's ID.
func (r *Ring) Self() string { return r.cfg.ReplicaID }

// Members returns the live replicas, sorted by ID.
func (r *Ring) Members() []Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.members)
}

// Owner returns the replica assigned key (an identity's client ID).
func (r *Ring) Owner(key string) Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RendezvousOwner(key, r.members)
}

// Owns reports whether this replica is assigned key.
func (r *Ring) Owns(key string) bool { return r.Owner(key).ID == r.cfg.ReplicaID }

// RendezvousOwner is the member with the highest hash of (key, member ID): every replica that
// sees the same live set assigns key alike, and a replica joining or leaving moves only the keys
// it wins or held.
func RendezvousOwner(key string, members []Member) Member {
	var best Member
	var bestScore uint64
	for _, m := range members {
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(m.ID))
		if s := h.Sum64(); best.ID == "" || s > bestScore {
			best, bestScore = m, s
		}
	}
	return best
}

func (r *Ring) leaseName() string { return r.cfg.Name + "-" + r.cfg.ReplicaID }

// renew writes this replica's Lease (creating it when absent).
func (r *Ring) renew(ctx context.Context, now time.Time) error {
	key := client.ObjectKey{Namespace: r.cfg.Namespace, Name: r.leaseName()}
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(r.cfg.ReplicaID),
		LeaseDurationSeconds: ptr.To(int32((r.cfg.TTL + time.Second - 1) / time.Second)),
		RenewTime:            &metav1.MicroTime{Time: now},
	}
	var lease coordinationv1.Lease
	err := r.cfg.Client.Get(ctx, key, &lease)
	switch {
	case apierrors.IsNotFound(err):
		spec.AcquireTime = &metav1.MicroTime{Time: now}
		lease = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels:      map[string]string{RingLabel: r.cfg.Name},
			Annotations: map[string]string{AddressAnnotation: r.cfg.Address}}, Spec: spec}
		if err := r.cfg.Client.Create(ctx, &lease); err != nil {
			return fmt.Errorf("create lease %s: %w", key, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("read lease %s: %w", key, err)
	}
	lease.Spec = spec
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[AddressAnnotation] = r.cfg.Address
	if err := r.cfg.Client.Update(ctx, &lease); err != nil {
		return fmt.Errorf("renew lease %s: %w", key, err)
	}
	return nil
}

// read lists the ring's Leases and keeps the live members; it reports whether the set changed.
func (r *Ring) read(ctx context.Context, now time.Time) (bool, error) {
	var list coordinationv1.LeaseList
	if err := r.cfg.Client.List(ctx, &list, client.InNamespace(r.cfg.Namespace), client.MatchingLabels{RingLabel: r.cfg.Name}); err != nil {
		return false, fmt.Errorf("list gateway leases: %w", err)
	}
	live := []Member{{ID: r.cfg.ReplicaID, Address: r.cfg.Address}}
	for _, l := range list.Items {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == r.cfg.ReplicaID || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			continue
		}
		expires := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
		if now.After(expires) {
			continue
		}
		live = append(live, Member{ID: *l.Spec.HolderIdentity, Address: l.Annotations[AddressAnnotation]})
	}
	slices.SortFunc(live, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	// The first read counts as a change: until it, nothing was held on the ring's word.
	first := r.readAt.IsZero()
	if now.After(r.readAt) {
		r.readAt = now
	}
	close(r.readDone)
	r.readDone = make(chan struct{})
	if !first && slices.Equal(live, r.members) {
		return false, nil
	}
	r.members = live
	return true, nil
}

// Tick renews this replica's Lease when due and re-reads the live set, calling the listeners
// when it changed. Run calls it every Interval; a test may call it directly.
func (r *Ring) Tick(ctx context.Context) error {
	now := time.Now()
	r.mu.Lock()
	due := now.Sub(r.renewed) >= r.cfg.TTL/3
	r.mu.Unlock()
	var errs []error
	if due {
		if err := r.renew(ctx, now); err != nil {
			errs = append(errs, err)
		} else {
			r.mu.Lock()
			r.renewed = now
			r.mu.Unlock()
		}
	}
	changed, err := r.read(ctx, now)
	if err != nil {
		errs = append(errs, err)
	}
	if changed {
		r.cfg.Logger.Info("gateway replicas changed", "members", r.Members())
		r.mu.Lock()
		ls := slices.Clone(r.listeners)
		r.mu.Unlock()
		for _, f := range ls {
			f()
		}
	}
	return errors.Join(errs...)
}

// Run keeps the ring until ctx ends, then leaves it.
func (r *Ring) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if err := r.Tick(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("gateway ring", "err", err)
		}
		select {
		case <-ctx.Done():
			r.Leave(context.Background())
			return
		case <-t.C:
		}
	}
}

// Leave deletes this replica's Lease, so that the others take its identities over at their next
// read instead of after the TTL.
func (r *Ring) Leave(ctx context.Context) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.cfg.Namespace, Name: r.leaseName()}}
	if err := r.cfg.Client.Delete(ctx, lease); err != nil && !apierrors.IsNotFound(err) {
		r.cfg.Logger.Error("leave gateway ring", "err", err)
	}
}

// Follow makes pool and out follow the ring: on each change of the live set the pool lets go of
// the callers another replica now serves and out syncs at once (letting go of the HTTP agents
// that moved, holding the ones that came); a caller's connection that was taken over reconnects
// only while the ring, read again, still assigns the caller here (reconnect.go).
func (r *Ring) Follow(ctx context.Context, pool *Pool, out *Outbound) {
	if pool != nil {
		pool.mu.Lock()
		pool.ring = r
		pool.mu.Unlock()
	}
	r.OnChange(func() {
		if out != nil {
			out.Resync()
		}
		if pool != nil {
			pool.Retain(ctx, func(ref a2amqtt.AgentRef) bool { return r.Owns(ref.ClientID()) })
		}
	})
}
