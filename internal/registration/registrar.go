package registration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
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
	// Reader lists Agents and Namespaces to resolve caller selectors (the manager's cache).
	Reader    client.Reader
	Backend   acl.Backend
	Cards     CardPublisher
	BrokerURL string
}

// Register makes the broker hold the Agent's client, ACLs and retained card. It records the
// digest of the card it published in agent.Status.PublishedCardDigest.
func (r *Registrar) Register(ctx context.Context, agent *a2av1.Agent, creds Credentials) error {
	id := identity.Of(agent)
	in := Input{Agent: id, Scope: agent.Spec.Callers.Scope, PoolID: agent.Spec.PoolID,
		Gated:        agent.Status.Topics != nil && agent.Status.Topics.Delivery != "",
		HasSelectors: len(agent.Spec.Callers.From) > 0}
	var err error
	if in.Callers, err = r.selectedCallers(ctx, agent); err != nil {
		return err
	}
	if in.CalledBy, err = r.calleesAdmitting(ctx, agent); err != nil {
		return err
	}
	// Observe once and diff against that same observation: shared groups hold other agents'
	// references, and a second, later observation (as acl.Apply makes) could contain a reference
	// added meanwhile that this agent's desired list does not know, which Diff would then remove.
	names := involvedNames(in)
	if in.Observed, err = r.Backend.Observe(ctx, &names); err != nil {
		return &StageError{Stage: StageACLs, Err: fmt.Errorf("observe ACL objects: %w", err)}
	}
	desired := Compile(in)
	desired.Passwords = map[string]string{identity.Username(id): creds.Password}
	// Not desired.Validate: it wants every role the shared groups reference observed, which is
	// O(fleet) reads per Agent; Compile only emits prefixed names, and the broker itself refuses
	// a reference to a missing role.
	cmds := acl.Diff(in.Observed, desired)
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
	card, err := json.Marshal(BuildCard(agent, id, r.BrokerURL))
	if err != nil {
		return fmt.Errorf("encode agent card: %w", err)
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

// Unregister removes the Agent's client, roles and callers group, and clears its card.
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

// involvedNames lists every broker object Compile may create, change, delete or read for in.
func involvedNames(in Input) acl.Names {
	n := SharedNames(in)
	d := Compile(in) // with nothing observed yet: names only
	for name := range d.Roles {
		n.Roles = append(n.Roles, name)
	}
	for name := range d.Groups {
		n.Groups = append(n.Groups, name)
	}
	for name := range d.Clients {
		n.Clients = append(n.Clients, name)
	}
	n.Roles = append(n.Roles, d.Delete.Roles...)
	n.Groups = append(n.Groups, d.Delete.Groups...)
	n.Clients = append(n.Clients, d.Delete.Clients...)
	return n
}

func createdClient(res acl.Result, username string) bool {
	for _, c := range res.Commands {
		if c.Op == acl.OpCreateClient && c.Username == username {
			return true
		}
	}
	return false
}

// selectedCallers resolves the Agent's callers.from selectors to identities.
func (r *Registrar) selectedCallers(ctx context.Context, agent *a2av1.Agent) ([]a2amqtt.AgentRef, error) {
	var out []a2amqtt.AgentRef
	for i, from := range agent.Spec.Callers.From {
		sel, err := metav1.LabelSelectorAsSelector(&from.AgentSelector)
		if err != nil {
			return nil, fmt.Errorf("callers.from[%d].agentSelector: %w", i, err)
		}
		namespaces, err := r.namespaces(ctx, agent.Namespace, from.NamespaceSelector)
		if err != nil {
			return nil, fmt.Errorf("callers.from[%d].namespaceSelector: %w", i, err)
		}
		for _, ns := range namespaces {
			var agents a2av1.AgentList
			if err := r.Reader.List(ctx, &agents, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return nil, fmt.Errorf("list caller agents: %w", err)
			}
			for j := range agents.Items {
				if agents.Items[j].DeletionTimestamp.IsZero() {
					out = append(out, identity.Of(&agents.Items[j]))
				}
			}
		}
	}
	return out, nil
}

// calleesAdmitting finds the Agents whose callers.from selectors select this Agent. Only Agents
// with selectors are examined (field index), so the cost follows the number of rules.
func (r *Registrar) calleesAdmitting(ctx context.Context, agent *a2av1.Agent) ([]a2amqtt.AgentRef, error) {
	var callees a2av1.AgentList
	if err := r.Reader.List(ctx, &callees, client.MatchingFields{identity.IndexAgentHasCallerSelectors: "true"}); err != nil {
		return nil, fmt.Errorf("list agents with caller selectors: %w", err)
	}
	var nsLabels labels.Set
	var out []a2amqtt.AgentRef
	for i := range callees.Items {
		callee := &callees.Items[i]
		if callee.UID == agent.UID || !callee.DeletionTimestamp.IsZero() {
			continue
		}
		for _, from := range callee.Spec.Callers.From {
			sel, err := metav1.LabelSelectorAsSelector(&from.AgentSelector)
			if err != nil || !sel.Matches(labels.Set(agent.Labels)) {
				continue
			}
			if from.NamespaceSelector == nil {
				if callee.Namespace != agent.Namespace {
					continue
				}
			} else {
				if nsLabels == nil {
					ns := &corev1.Namespace{}
					if err := r.Reader.Get(ctx, client.ObjectKey{Name: agent.Namespace}, ns); err != nil {
						return nil, fmt.Errorf("get namespace %s: %w", agent.Namespace, err)
					}
					nsLabels = labels.Set(ns.Labels)
				}
				nsSel, err := metav1.LabelSelectorAsSelector(from.NamespaceSelector)
				if err != nil || !nsSel.Matches(nsLabels) {
					continue
				}
			}
			out = append(out, identity.Of(callee))
			break
		}
	}
	return out, nil
}

// namespaces returns the namespaces a caller selector searches.
func (r *Registrar) namespaces(ctx context.Context, own string, sel *metav1.LabelSelector) ([]string, error) {
	if sel == nil {
		return []string{own}, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, err
	}
	var list corev1.NamespaceList
	if err := r.Reader.List(ctx, &list, client.MatchingLabelsSelector{Selector: s}); err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	out := make([]string, 0, len(list.Items))
	for _, ns := range list.Items {
		out = append(out, ns.Name)
	}
	return out, nil
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
