package registration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// CardPublisher puts retained agent cards on discovery topics.
type CardPublisher interface {
	// PublishCard publishes payload retained on topic with the given user properties; an empty
	// payload clears the retained message.
	PublishCard(ctx context.Context, topic string, payload []byte, props map[string]string) error
}

// Registrar registers Agents on a broker backend (the controllers' Registrar).
type Registrar struct {
	// Reader lists Agents, Namespaces, Tenants and AgentGrants to resolve caller selectors and
	// consent (the manager's cache).
	Reader    client.Reader
	Backend   acl.Backend
	Cards     CardPublisher
	BrokerURL string
}

// Register makes the broker hold the Agent's client, own role and retained card. It records the
// digest of the card it published in agent.Status.PublishedCardDigest. The Agent must be live
// (permitted, the holder of its identity: the controller checks) and its caller selectors valid.
func (r *Registrar) Register(ctx context.Context, agent *a2av1.Agent, creds Credentials) error {
	id := identity.Of(agent)
	view, err := (&tenancy.Authorizer{Reader: r.Reader}).View(ctx)
	if err != nil {
		return &StageError{Stage: StageACLs, Err: err}
	}
	in, err := InputFor(ctx, view, agent)
	if err != nil {
		return &StageError{Stage: StageACLs, Err: err}
	}
	// Observe once and diff against that same observation. The backend's copy is enough: a
	// change of another admin that it has not learnt of yet is repaired by the next reconcile,
	// as one made between an Observe and its Execute always was, and a reconcile of an Agent
	// whose objects are in place costs the broker nothing (a status round trip each before).
	names := OwnNames(id)
	if in.Observed, err = acl.ObserveCached(ctx, r.Backend, &names); err != nil {
		return &StageError{Stage: StageACLs, Err: fmt.Errorf("observe ACL objects: %w", err)}
	}
	desired := Compile(in)
	desired.Passwords = map[string]string{identity.Username(id): creds.Password}
	// Not desired.Validate: Compile only emits prefixed names, and the broker itself refuses a
	// reference to a missing role.
	ownRole := identity.AgentRoleName(id)
	cmds := withoutRevocationKicks(acl.Diff(in.Observed, desired), func(c acl.Command) bool {
		// A caller that loses another agent's card keeps its connection: cards are discovery
		// metadata, and the subscription ends at its next reconnect. Only the agent's own
		// request, delivery and pool subscriptions are revoked with a kick (of itself).
		return c.Role == ownRole && isDiscoveryTopic(c.ACL.Topic)
	})
	if len(cmds) > 0 {
		if err := r.Backend.Execute(ctx, cmds); err != nil {
			return &StageError{Stage: StageACLs, Err: fmt.Errorf("apply %d ACL commands (%s): %w", len(cmds), acl.Summary(cmds), err)}
		}
	}
	res := acl.Result{Commands: cmds}
	if creds.PasswordChanged && !createdClient(res, identity.Username(id)) {
		if err := acl.SetPassword(ctx, r.Backend, identity.Username(id), creds.Password); err != nil {
			return &StageError{Stage: StageCredentials, Err: fmt.Errorf("set password: %w", err)}
		}
	}
	card, err := json.Marshal(BuildCard(agent, id, in.Pool, r.BrokerURL))
	if err != nil {
		return fmt.Errorf("encode agent card: %w", err)
	}
	// Checked before publishing: a retained card over the broker's packet limit makes the broker
	// disconnect the operator's shared card connection, every time it is retried.
	limits, tenant, err := view.LimitsFor(ctx, agent.Namespace)
	if err != nil {
		return &StageError{Stage: StageCard, Err: err}
	}
	if maxBytes := int(*limits.MaxCardBytes); len(card) > maxBytes {
		return &StageError{Stage: StageCard, Err: &CardTooLargeError{Bytes: len(card), Max: maxBytes, Tenant: tenant}}
	}
	sum := sha256.Sum256(card)
	digest := hex.EncodeToString(sum[:])
	if digest == agent.Status.PublishedCardDigest {
		// Republishing an unchanged card would overwrite the "online" card that a connected agent
		// publishes for itself with our "registered, not seen" one.
		return nil
	}
	// Registered, not observed online: the agent's own online card (source "agent") replaces this
	// one when it connects, its LWT when it dies.
	if err := r.Cards.PublishCard(ctx, id.DiscoveryTopic(), card, map[string]string{
		a2amqtt.PropStatus: a2amqtt.StatusOffline, a2amqtt.PropStatusSource: a2amqtt.SourceBroker,
	}); err != nil {
		return &StageError{Stage: StageCard, Err: err}
	}
	agent.Status.PublishedCardDigest = digest
	return nil
}

func isDiscoveryTopic(topic string) bool {
	info, err := a2amqtt.ParseTopic(topic)
	return err == nil && info.Method == a2amqtt.MethodDiscovery
}

// Unregister removes the Agent's client and role, and clears its card. The controller calls it
// only for the holder of the identity, so deleting the loser of an identity conflict never
// touches the winner's broker state.
func (r *Registrar) Unregister(ctx context.Context, agent *a2av1.Agent) error {
	id := identity.Of(agent)
	if _, err := acl.Apply(ctx, r.Backend, Removal(id)); err != nil {
		return fmt.Errorf("remove ACLs: %w", err)
	}
	if err := r.Cards.PublishCard(ctx, id.DiscoveryTopic(), nil, nil); err != nil {
		return fmt.Errorf("clear agent card: %w", err)
	}
	return nil
}

// ApplyShared makes shared object k hold exactly the contributions of members (computed by the
// caller from the cache: the live agents of the unit, org or gate). It changes the shared role by
// modifyRole only and disconnects nobody: the unit and org roles grant publishing (checked per
// message) and the org's constant discovery pattern; the conversation service unsubscribes by
// itself from an agent that is no longer gated (its registry drops it), so taking that
// subscribe grant away needs no kick either.
func (r *Registrar) ApplyShared(ctx context.Context, k SharedKey, members []Member) error {
	names := SharedNames(k)
	observed, err := acl.ObserveCached(ctx, r.Backend, &names) // see Register
	if err != nil {
		return fmt.Errorf("observe %s: %w", k, err)
	}
	cmds := withoutRevocationKicks(acl.Diff(observed, SharedDesired(k, members)), func(acl.Command) bool { return true })
	if len(cmds) == 0 {
		return nil
	}
	if err := r.Backend.Execute(ctx, cmds); err != nil {
		return fmt.Errorf("apply %s (%s): %w", k, acl.Summary(cmds), err)
	}
	return nil
}

func createdClient(res acl.Result, username string) bool {
	for _, c := range res.Commands {
		if c.Op == acl.OpCreateClient && c.Username == username {
			return true
		}
	}
	return false
}

// MemberOf is how agent appears in the ACLs of others, and whether it is live at all (permitted,
// the holder of its identity, not being deleted): only live agents appear anywhere. Gating is
// read from status.topics.delivery, which the controller sets.
func MemberOf(ctx context.Context, v *tenancy.View, agent *a2av1.Agent) (Member, bool, error) {
	live, err := v.Live(ctx, agent)
	if err != nil || !live {
		return Member{}, false, err
	}
	m := Member{Agent: identity.Of(agent), Scope: agent.Spec.Callers.Scope,
		Gated: agent.Status.Topics != nil && agent.Status.Topics.Delivery != ""}
	joined, _, err := v.PoolJoined(ctx, agent)
	if err != nil {
		return Member{}, false, err
	}
	if joined {
		m.Pool = agent.Spec.PoolID
	}
	return m, true, nil
}

// InputFor resolves everything the Agent's own broker objects depend on (Observed excepted): its
// membership, the live callers its selectors admit where their namespaces consent, and the live
// agents whose selectors admit it where its namespace consents.
func InputFor(ctx context.Context, v *tenancy.View, agent *a2av1.Agent) (Input, error) {
	self, live, err := MemberOf(ctx, v, agent)
	if err != nil {
		return Input{}, err
	}
	if !live {
		return Input{}, fmt.Errorf("agent %s/%s does not hold identity %s", agent.Namespace, agent.Name, identity.Of(agent).ClientID())
	}
	in := Input{Agent: self.Agent, Scope: self.Scope, Pool: self.Pool, Gated: self.Gated}
	if in.Callers, _, err = SelectedCallers(ctx, v, agent); err != nil {
		return Input{}, err
	}
	if in.Callees, err = calleesAdmitting(ctx, v, agent); err != nil {
		return Input{}, err
	}
	return in, nil
}

// SelectedCallers resolves the Agent's callers.from selectors to the live agents they admit
// (tenancy.View.Callers: the caller graph's enumeration of the rule View.Selects decides).
// Agents of another namespace count only where an AgentGrant of their namespace consents;
// ungranted lists the namespaces whose selected agents were left out for want of one.
func SelectedCallers(ctx context.Context, v *tenancy.View, agent *a2av1.Agent) (callers []a2amqtt.AgentRef, ungranted []string, err error) {
	admitted, ungranted, err := v.Callers(ctx, agent)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range admitted {
		callers = append(callers, identity.Of(c))
	}
	return callers, ungranted, nil
}

// calleesAdmitting finds the live Agents whose callers.from selectors select this Agent (with its
// namespace's consent where they are of another namespace): tenancy.View.Callees.
func calleesAdmitting(ctx context.Context, v *tenancy.View, agent *a2av1.Agent) ([]Member, error) {
	callees, err := v.Callees(ctx, agent)
	if err != nil {
		return nil, err
	}
	out := make([]Member, 0, len(callees))
	for _, callee := range callees {
		m, live, err := MemberOf(ctx, v, callee)
		if err != nil {
			return nil, err
		}
		if live {
			out = append(out, m)
		}
	}
	return out, nil
}

// CardTooLargeError: the agent card is larger than its Tenant's limits.maxCardBytes; it was not
// published. Only a spec or Tenant change can fix it.
type CardTooLargeError struct {
	Bytes, Max int
	// Tenant sets the limit (nil: the default of a namespace no Tenant binds).
	Tenant *a2av1.Tenant
}

func (e *CardTooLargeError) Error() string {
	who := "the default limit (no Tenant binds the namespace)"
	if e.Tenant != nil {
		who = "Tenant " + e.Tenant.Name + "'s limits.maxCardBytes"
	}
	return fmt.Sprintf("the agent card is %d bytes, more than the %d that %s allows: it is not published", e.Bytes, e.Max, who)
}

// Registration stages, so that a failure shows in the right condition.
const (
	StageACLs        = "ACLs"
	StageCard        = "Card"
	StageCredentials = "Credentials"
)

// StageError is a registration failure in one stage.
type StageError struct {
	Stage string
	Err   error
}

func (e *StageError) Error() string { return strings.ToLower(e.Stage) + ": " + e.Err.Error() }
func (e *StageError) Unwrap() error { return e.Err }

// Credentials are an Agent's broker credentials.
type Credentials struct {
	Username, Password, ClientID string
	// PasswordChanged is true when the broker does not yet have Password.
	PasswordChanged bool
}
