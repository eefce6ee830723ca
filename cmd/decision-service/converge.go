package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// converger keeps this replica's table equal to what the operator would put on a broker, from
// the Kubernetes objects alone: the same pure compile (registration.Compile per live Agent,
// registration.SharedDesired per unit, org and the gates), the passwords of the Agents'
// credential Secrets, the conversation service's identity; applied with acl.Diff (Prune) into
// the local embedded.Store. No leader, no broker, no operator: every replica converges alone, so
// any of them can answer and none is on the data path alone.
type converger struct {
	reader client.Reader
	store  *embedded.Store
	// serviceSecret is the conversation service's credentials Secret (nil: no service identity).
	serviceSecret *client.ObjectKey
	gating        bool
	// debounce gathers a burst of events into one pass; resync bounds the age of the table.
	debounce, resync time.Duration
	log              logr.Logger

	kick   chan struct{}
	ready  atomic.Bool
	passes atomic.Uint64
	// lastPass is how long the last successful pass took (ns): the delay a change waits for
	// beyond the debounce.
	lastPass atomic.Int64
}

func newConverger(reader client.Reader, store *embedded.Store, serviceSecret *client.ObjectKey, gating bool, log logr.Logger) *converger {
	return &converger{reader: reader, store: store, serviceSecret: serviceSecret, gating: gating,
		debounce: 100 * time.Millisecond, resync: time.Minute, log: log, kick: make(chan struct{}, 1)}
}

// Ready reports whether a full pass has completed (the decision endpoint refuses everything
// before: fail closed).
func (c *converger) Ready() bool { return c.ready.Load() }

// NeedLeaderElection: every replica converges (manager.LeaderElectionRunnable).
func (c *converger) NeedLeaderElection() bool { return false }

func (c *converger) trigger() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// watch makes every change to an object the table depends on trigger a pass.
func (c *converger) watch(ctx context.Context, informers cache.Informers) error {
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.trigger() },
		UpdateFunc: func(any, any) { c.trigger() },
		DeleteFunc: func(any) { c.trigger() },
	}
	for _, obj := range []client.Object{&a2av1.Agent{}, &a2av1.Tenant{}, &a2av1.AgentGrant{}, &corev1.Namespace{}, &corev1.Secret{}} {
		inf, err := informers.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
	}
	return nil
}

// Start runs passes until ctx ends: at once (the manager starts runnables after its cache has
// synced), then after every burst of changes and every resync period. A failed pass is
// retried after the debounce; readiness stays as it was (a table that was complete keeps
// answering; one that never was keeps refusing).
func (c *converger) Start(ctx context.Context) error {
	c.trigger()
	resync := time.NewTicker(c.resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-resync.C:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.debounce):
		}
		// Events during the wait are part of this pass.
		select {
		case <-c.kick:
		default:
		}
		start := time.Now()
		n, err := c.converge(ctx)
		if err != nil {
			c.log.Error(err, "table pass failed; retrying")
			c.trigger()
			continue
		}
		c.lastPass.Store(int64(time.Since(start)))
		c.passes.Add(1)
		if !c.ready.Swap(true) {
			clients, roles, groups := c.store.Size()
			c.log.Info("table synced: answering", "clients", clients, "roles", roles, "groups", groups, "took", time.Since(start).String())
		} else if n > 0 {
			c.log.V(1).Info("table converged", "commands", n, "took", time.Since(start).String())
		}
	}
}

// converge makes the store hold desired; it returns the number of commands it executed.
func (c *converger) converge(ctx context.Context) (int, error) {
	d, err := desiredTable(ctx, c.reader, c.serviceSecret, c.gating)
	if err != nil {
		return 0, err
	}
	observed, err := c.store.Observe(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("observe the table: %w", err)
	}
	cmds := acl.Diff(observed, d)
	if len(cmds) > 0 {
		if err := c.store.Execute(ctx, cmds); err != nil {
			return 0, fmt.Errorf("apply %d commands (%s): %w", len(cmds), acl.Summary(cmds), err)
		}
	}
	// Diff sets a password only on a client it creates; a Secret's new password (a rotation) is
	// found by asking the table whether the Secret's password is the one it holds.
	var errs []error
	for user, pw := range d.Passwords {
		cl := d.Clients[user]
		if c.store.Authenticate(user, pw, cl.ClientID) {
			continue
		}
		if err := acl.SetPassword(ctx, c.store, user, pw); err != nil {
			errs = append(errs, err)
			continue
		}
		cmds = append(cmds, acl.Command{Op: acl.OpSetClientPassword, Username: user})
	}
	return len(cmds), errors.Join(errs...)
}

// desiredTable is the whole table the operator's registration puts on a broker, computed from
// the cache: every live Agent's own objects and password, the unit, org and gates roles of their
// members, and the conversation service's identity. Names no Agent claims are pruned.
func desiredTable(ctx context.Context, reader client.Reader, serviceSecret *client.ObjectKey, gating bool) (acl.Desired, error) {
	view, err := (&tenancy.Authorizer{Reader: reader}).View(ctx)
	if err != nil {
		return acl.Desired{}, err
	}
	var agents a2av1.AgentList
	if err := reader.List(ctx, &agents); err != nil {
		return acl.Desired{}, fmt.Errorf("list agents: %w", err)
	}
	d := acl.Desired{State: acl.NewState(nil, nil, nil), Passwords: map[string]string{}, Prune: true}
	d.DefaultACL = &acl.DenyByDefault
	members := map[registration.SharedKey][]registration.Member{}
	for i := range agents.Items {
		agent := &agents.Items[i]
		m, live, err := registration.MemberOf(ctx, view, agent)
		if err != nil {
			return acl.Desired{}, fmt.Errorf("agent %s/%s: %w", agent.Namespace, agent.Name, err)
		}
		if !live {
			continue
		}
		password, ok, err := agentPassword(ctx, reader, agent)
		if err != nil {
			return acl.Desired{}, err
		}
		if !ok {
			// No credentials yet (the operator writes them first): nothing to authenticate.
			continue
		}
		in, err := registration.InputFor(ctx, view, agent)
		if err != nil {
			return acl.Desired{}, fmt.Errorf("agent %s/%s: %w", agent.Namespace, agent.Name, err)
		}
		merge(&d.State, registration.Compile(in).State)
		d.Passwords[identity.Username(m.Agent)] = password
		for _, k := range registration.KeysOf(m.Agent, gating) {
			members[k] = append(members[k], m)
		}
	}
	if gating {
		if _, ok := members[registration.GatesKey]; !ok {
			members[registration.GatesKey] = nil
		}
	}
	for k, ms := range members {
		merge(&d.State, registration.SharedDesired(k, ms).State)
	}
	if serviceSecret != nil {
		if err := addService(ctx, reader, *serviceSecret, &d); err != nil {
			return acl.Desired{}, err
		}
	}
	return d, nil
}

// addService adds the conversation service's identity with the password of its Secret (none
// yet: left out until the operator writes it).
func addService(ctx context.Context, reader client.Reader, key client.ObjectKey, d *acl.Desired) error {
	var secret corev1.Secret
	if err := reader.Get(ctx, key, &secret); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil
		}
		return fmt.Errorf("service credentials %s: %w", key, err)
	}
	password := string(secret.Data[identity.SecretKeyPassword])
	if password == "" {
		return nil
	}
	merge(&d.State, registration.ServiceIdentity())
	if _, ok := d.Roles[identity.GatesRoleName]; !ok {
		d.Roles[identity.GatesRoleName] = acl.Role{Name: identity.GatesRoleName}
	}
	d.Passwords[identity.ServiceUsername] = password
	return nil
}

// agentPassword reads the Agent's broker password from the credentials Secret the operator
// wrote (its controller reference must be the Agent: a Secret of the same name made by someone
// else is not the Agent's).
func agentPassword(ctx context.Context, reader client.Reader, agent *a2av1.Agent) (string, bool, error) {
	var secret corev1.Secret
	key := client.ObjectKey{Namespace: agent.Namespace, Name: identity.CredentialsSecretName(agent)}
	if err := reader.Get(ctx, key, &secret); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return "", false, nil
		}
		return "", false, fmt.Errorf("credentials of agent %s/%s: %w", agent.Namespace, agent.Name, err)
	}
	if !metav1.IsControlledBy(&secret, agent) {
		return "", false, nil
	}
	pw := string(secret.Data[identity.SecretKeyPassword])
	return pw, pw != "", nil
}

// merge adds src's objects to dst (an object named in both is the same in both: the unit and
// org groups that Compile declares are the ones SharedDesired declares).
func merge(dst *acl.State, src acl.State) {
	for n, r := range src.Roles {
		dst.Roles[n] = r
	}
	for n, g := range src.Groups {
		dst.Groups[n] = g
	}
	for n, cl := range src.Clients {
		dst.Clients[n] = cl
	}
}
