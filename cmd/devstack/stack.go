package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/policy"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// serviceSecret is where the broker runtime keeps the conversation service's broker credentials
// (the name earlier versions of the stack used, so an existing state dir keeps its identity).
var serviceSecret = client.ObjectKey{Namespace: "a2a-fleet-system", Name: "conversation-service-credentials"}

// exampleLabel on a sample Agent names the example agent (examples/agents) the stack runs for it.
const exampleLabel = "a2a.fleet.dev/example"

// startConversationService waits for the broker identity the broker runtime gives the service
// (its Secret, written once the broker has the password) and runs the service in-process with a
// bbolt store in the state dir, so conversations survive restarts of the stack.
func startConversationService(ctx context.Context, c client.Client, o options, brokerURL, stateDir string, cfg *rest.Config) (*convservice.Service, error) {
	secret := &corev1.Secret{}
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Get(ctx, serviceSecret, secret)
		if err == nil && len(secret.Data[identity.SecretKeyPassword]) > 0 {
			break
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read service credentials %s: %w", serviceSecret, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the operator did not write the conversation service's credentials %s within a minute (see the broker log lines above)", serviceSecret)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	svc, err := convservice.Start(ctx, convservice.Config{
		BrokerURL:   brokerURL,
		Username:    identity.ServiceUsername,
		Password:    string(secret.Data[identity.SecretKeyPassword]),
		ReplicaID:   "dev",
		Store:       "bolt:" + filepath.Join(stateDir, "conversations.db"),
		RestConfig:  cfg,
		MetricsAddr: o.serviceMetricsAddr,
		HealthAddr:  o.serviceProbeAddr,
		Logger:      ctrl.Log.WithName("conversation-service"),
	})
	if err != nil {
		return nil, fmt.Errorf("start conversation service: %w", err)
	}
	return svc, nil
}

// applySamples server-side applies every manifest of dir in the default namespace (field manager
// devstack-samples, without force): a state dir from an earlier version gets the samples' new
// fields, and a field you changed yourself (kubectl edit, apply) is kept, the sample being skipped
// with a note instead.
func applySamples(ctx context.Context, c client.Client, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no sample manifests in %s (err %v)", dir, err)
	}
	// Policies first, so that governed Agents are gated from their first reconcile on.
	slices.SortStableFunc(files, func(a, b string) int {
		return cmp.Compare(boolInt(!strings.Contains(filepath.Base(a), "policy")), boolInt(!strings.Contains(filepath.Base(b), "policy")))
	})
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue // kustomize's index of the same files (kubectl apply -k config/samples)
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			return fmt.Errorf("parse %s: %w", f, err)
		}
		if u.GetNamespace() == "" {
			u.SetNamespace(metav1.NamespaceDefault)
		}
		err = c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("devstack-samples"))
		switch {
		case apierrors.IsConflict(err):
			ctrl.Log.WithName("samples").Info("keeping your change to a sample; not applying it", "file", f, "conflict", err.Error())
		case err != nil:
			return fmt.Errorf("apply %s: %w", f, err)
		}
	}
	return nil
}

// startExampleAgents waits until every sample Agent labelled with an example kind is Ready and
// runs that example with the Agent's credentials and request (or delivery) topic. cardStatus,
// set when the operator signs cards, is the status of the card on a discovery topic: the
// examples then leave their cards to the operator, and this waits until their cards say online.
func startExampleAgents(ctx context.Context, c client.Client, brokerURL string, creds *credentialsProjection, cardStatus func(topic string) string) (func(), error) {
	signedCards := cardStatus != nil
	var list a2av1.AgentList
	if err := c.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault), client.HasLabels{exampleLabel}); err != nil {
		return nil, fmt.Errorf("list example agents: %w", err)
	}
	var running []*agents.Agent
	stop := func() {
		// Together, each bounded: an agent publishes its offline card and disconnects.
		var wg sync.WaitGroup
		for _, a := range running {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				_ = a.Close(ctx)
			})
		}
		wg.Wait()
	}
	for i := range list.Items {
		a, err := startExampleAgent(ctx, c, &list.Items[i], brokerURL, creds, signedCards)
		if err != nil {
			stop()
			return nil, err
		}
		running = append(running, a)
	}
	if signedCards {
		waitCardsOnline(ctx, list.Items, cardStatus)
	}
	return stop, nil
}

// cardsOnlineWait bounds waitCardsOnline: the operator marks a card online presenceCardGrace (2 s)
// after the broker saw its agent connect.
const cardsOnlineWait = 15 * time.Second

// waitCardsOnline waits until the card of every agent says online, so that the stack is up only
// once a client sees the example agents online (a2actl chat warns about an agent marked
// offline). The operator publishes their cards with the broker's view of their connection; an
// agent whose card is not online within cardsOnlineWait is logged, and the stack goes on.
func waitCardsOnline(ctx context.Context, agents []a2av1.Agent, cardStatus func(topic string) string) {
	deadline := time.Now().Add(cardsOnlineWait)
	for i := range agents {
		topic := identity.Of(&agents[i]).DiscoveryTopic()
		for cardStatus(topic) != a2amqtt.StatusOnline {
			if time.Now().After(deadline) || ctx.Err() != nil {
				ctrl.Log.WithName("samples").Info("the example agent's card does not say online yet", "agent", agents[i].Namespace+"/"+agents[i].Name, "status", cardStatus(topic))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func startExampleAgent(ctx context.Context, c client.Client, sample *a2av1.Agent, brokerURL string, creds *credentialsProjection, signedCards bool) (*agents.Agent, error) {
	key := client.ObjectKeyFromObject(sample)
	deadline := time.Now().Add(time.Minute)
	agent := &a2av1.Agent{}
	for {
		if err := c.Get(ctx, key, agent); err != nil {
			return nil, fmt.Errorf("get agent %s: %w", key, err)
		}
		// Ready under the policy that governs it: only then is its delivery topic final.
		var policies a2av1.ConversationPolicyList
		if err := c.List(ctx, &policies, client.InNamespace(key.Namespace)); err != nil {
			return nil, fmt.Errorf("list policies: %w", err)
		}
		want := ""
		if m := policy.Matching(policies.Items, agent.Labels); len(m) > 0 {
			want = m[0].Name
		}
		if meta.IsStatusConditionTrue(agent.Status.Conditions, a2av1.ConditionReady) &&
			agent.Status.ConversationPolicy == want && (want == "") == (agent.Status.Topics.Delivery == "") {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("agent %s not Ready after a minute: %v", key, agent.Status.Conditions)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: agent.Status.CredentialsSecret}, secret); err != nil {
		return nil, fmt.Errorf("read credentials of %s: %w", key, err)
	}
	// The agent reads its credentials folder at every CONNECT, as an SDK agent with its Secret
	// mounted does: a rotation reaches it as soon as the operator writes the Secret.
	for !creds.holds(key.Namespace, secret.Name, secret.Data[identity.SecretKeyPassword]) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("credentials of %s not in %s after a minute", key, creds.dir(key.Namespace, secret.Name))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	kind := agents.Kind(agent.Labels[exampleLabel])
	a, err := agents.Start(ctx, kind, agents.Options{
		BrokerURL:    brokerURL,
		Credentials:  a2amqtt.CredentialsDir(creds.dir(key.Namespace, secret.Name)),
		Agent:        identity.Of(agent),
		RequestTopic: agent.Status.Topics.Delivery,
		// A persistent session, as the example agents' default: a request the broker was sending
		// when a rotation kicked the agent is delivered after its next CONNECT, not dropped.
		SessionExpiry: a2amqtt.DefaultAgentSessionExpiry,
		// The manifest's card, as the operator publishes it: one card per agent (docs/api.md).
		Card: registration.BuildCard(agent, identity.Of(agent), agent.Spec.PoolID, brokerURL),
		// The operator publishes the card, signed, and keeps its status from the broker's view of
		// the connection; the example's own publish would replace it with an unsigned copy.
		CardPublisher: cardPublisher(signedCards),
		// The governed memory agent reads earlier turns from the conversation service, whose
		// bbolt store survives a crash of the stack (its own task store does not).
		HistoryFrom: agents.GovernedHistory(kind, agent.Status.Topics.Delivery),
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("start example agent %s (%s)", key, kind), err)
	}
	return a, nil
}

// cardPublisher is who publishes an example agent's card: the operator when it signs cards (as
// under an install, where A2A_AGENT_CARD does the same), else the example (presence by LWT).
func cardPublisher(signedCards bool) a2amqtt.CardPublisher {
	if signedCards {
		return a2amqtt.CardPublisherOperator
	}
	return a2amqtt.CardPublisherAgent
}
