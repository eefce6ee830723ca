package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// envAsAgent is --as-agent's variable.
const envAsAgent = "A2A_AS_AGENT"

// Optional keys of a credentials Secret. The operator writes username, password and clientID; a
// Secret that also carries the broker's URL or CA (copied next to another cluster's broker, or
// extended by an administrator) is used with them, unless --broker or --tls-ca say otherwise.
const (
	secretKeyBrokerURL = "brokerURL"
	secretKeyCA        = "ca.crt"
)

// kubeTimeout bounds each read of the Agent or its Secret.
const kubeTimeout = 10 * time.Second

// agentCredentials are what the operator issued an Agent: its MQTT client ID, and a source that
// reads the username and password from the Agent's credentials Secret at every CONNECT (so a chat
// that outlives a rotation reconnects with the new password).
type agentCredentials struct {
	clientID  string
	brokerURL string
	tls       *tls.Config
	source    *secretCredentials
}

// loadAgentCredentials reads Agent name (in namespace, default: the kubeconfig context's) and its
// credentials Secret through the kubeconfig (explicit path, else KUBECONFIG, else
// ~/.kube/config), as kubectl would.
func loadAgentCredentials(ctx context.Context, kubeconfig, namespace, name string) (*agentCredentials, error) {
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: namespace}}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides)
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	// Only the two kinds read: the whole client-go scheme would double the binary's start-up.
	if err := errors.Join(corev1.AddToScheme(scheme), a2av1.AddToScheme(scheme)); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, kubeTimeout)
	defer cancel()
	agent := &a2av1.Agent{}
	if err := k8s.Get(rctx, client.ObjectKey{Namespace: ns, Name: name}, agent); err != nil {
		return nil, fmt.Errorf("read Agent %s/%s: %w", ns, name, err)
	}
	secretName := agent.Status.CredentialsSecret
	if secretName == "" {
		secretName = identity.CredentialsSecretName(agent)
	}
	src := &secretCredentials{k8s: k8s, key: client.ObjectKey{Namespace: ns, Name: secretName}}
	secret, err := src.read(rctx)
	if err != nil {
		return nil, fmt.Errorf("agent %s/%s: %w (the operator writes it once the Agent is registered)", ns, name, err)
	}
	creds := &agentCredentials{clientID: string(secret.Data[identity.SecretKeyClientID]), brokerURL: string(secret.Data[secretKeyBrokerURL]), source: src}
	if creds.clientID == "" {
		creds.clientID = identity.Of(agent).ClientID()
	}
	if ca := secret.Data[secretKeyCA]; len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("secret %s/%s: %s holds no PEM certificate", ns, secretName, secretKeyCA)
		}
		creds.tls = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return creds, nil
}

// secretCredentials is the a2amqtt.CredentialSource of --as-agent: the Secret's username and
// password, read again at every CONNECT; when a read fails, the last ones read are used.
type secretCredentials struct {
	k8s client.Client
	key client.ObjectKey

	mu       sync.Mutex
	username string
	password []byte
}

// read gets the Secret and keeps its username and password.
func (s *secretCredentials) read(ctx context.Context) (*corev1.Secret, error) {
	secret := &corev1.Secret{}
	if err := s.k8s.Get(ctx, s.key, secret); err != nil {
		return nil, fmt.Errorf("read credentials Secret %s: %w", s.key, err)
	}
	user, pass := string(secret.Data[identity.SecretKeyUsername]), secret.Data[identity.SecretKeyPassword]
	if user == "" || len(pass) == 0 {
		return nil, fmt.Errorf("credentials Secret %s has no %s or %s yet", s.key, identity.SecretKeyUsername, identity.SecretKeyPassword)
	}
	s.mu.Lock()
	s.username, s.password = user, pass
	s.mu.Unlock()
	return secret, nil
}

// Credentials implements a2amqtt.CredentialSource.
func (s *secretCredentials) Credentials() (string, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	_, _ = s.read(ctx) // on failure the last credentials read are still the best guess
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.username, s.password, nil
}

var _ a2amqtt.CredentialSource = (*secretCredentials)(nil)
