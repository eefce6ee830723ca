package registration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Event reasons on the conversation service's credentials Secret.
const (
	EventServiceIdentityCreated  = "ServiceIdentityCreated"
	EventServiceIdentityRepaired = "ServiceIdentityRepaired"
	EventServiceCredentialsNew   = "ServiceCredentialsRecreated"
	EventServiceIdentityFailed   = "ServiceIdentityFailed"
)

// ServiceRepair says what EnsureServiceIdentity changed.
type ServiceRepair struct {
	// SecretCreated: the credentials Secret did not exist and was written with a new password.
	SecretCreated bool
	// Commands are the broker commands sent (empty when the broker was in sync).
	Commands []acl.Command
	// PasswordSet: the broker was given the Secret's password (a new Secret for an existing
	// broker client).
	PasswordSet bool
}

// Changed reports whether anything was changed.
func (r ServiceRepair) Changed() bool { return r.SecretCreated || len(r.Commands) > 0 || r.PasswordSet }

// EnsureServiceCredentials gives the conversation service its broker identity and keeps its
// password in the Secret secretKey (keys username and password), creating the Secret when it is
// missing. It is idempotent: with the Secret in place and the broker in sync it sends nothing.
func EnsureServiceCredentials(ctx context.Context, c client.Client, backend acl.Backend, secretKey client.ObjectKey) error {
	_, _, err := EnsureServiceIdentity(ctx, c, backend, secretKey)
	return err
}

// EnsureServiceIdentity is EnsureServiceCredentials reporting what it repaired, and the Secret.
func EnsureServiceIdentity(ctx context.Context, c client.Client, backend acl.Backend, secretKey client.ObjectKey) (ServiceRepair, *corev1.Secret, error) {
	var rep ServiceRepair
	secret := &corev1.Secret{}
	err := c.Get(ctx, secretKey, secret)
	switch {
	case apierrors.IsNotFound(err):
		password, err := identity.NewPassword()
		if err != nil {
			return rep, nil, fmt.Errorf("service credentials: %w", err)
		}
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name,
				Labels: map[string]string{identity.LabelManagedBy: identity.ManagedByValue}},
			Data: map[string][]byte{
				identity.SecretKeyUsername: []byte(identity.ServiceUsername),
				identity.SecretKeyPassword: []byte(password),
			},
		}
		if err := c.Create(ctx, secret); err != nil {
			return rep, nil, fmt.Errorf("create service credentials secret: %w", err)
		}
		rep.SecretCreated = true
	case err != nil:
		return rep, nil, fmt.Errorf("get service credentials secret: %w", err)
	}
	password := string(secret.Data[identity.SecretKeyPassword])
	if password == "" {
		return rep, secret, fmt.Errorf("service credentials secret %s has no %q key; delete it to have a new one written", secretKey, identity.SecretKeyPassword)
	}

	// The service group references the gates role: create-only, for the shared reconcile of
	// GatesKey owns its content and may be filling it at this very moment (after a broker state
	// loss both run).
	res, err := acl.Apply(ctx, backend, acl.Desired{
		State:       ServiceIdentity(),
		CreateRoles: []string{identity.GatesRoleName},
		Passwords:   map[string]string{identity.ServiceUsername: password},
	})
	rep.Commands = res.Commands
	if err != nil {
		return rep, secret, fmt.Errorf("apply service identity: %w", err)
	}
	if rep.SecretCreated && !createdClient(res, identity.ServiceUsername) {
		// A new Secret for an existing broker client: the broker must learn the new password.
		if err := acl.SetPassword(ctx, backend, identity.ServiceUsername, password); err != nil {
			return rep, secret, fmt.Errorf("set service password: %w", err)
		}
		rep.PasswordSet = true
	}
	return rep, secret, nil
}

// serviceIdentity reconciles the conversation service's broker identity like an Agent's: at
// start (retrying while the broker is down), every ServiceResync (drift repair), when its
// Secret changes or disappears, and when the broker lost its state. Every repair is logged and
// recorded as an Event on the Secret, which the service's operators can see.
type serviceIdentity struct {
	b    *Broker
	key  client.ObjectKey
	wake chan struct{}
}

func (s *serviceIdentity) trigger() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// watchSecret triggers a repair when the Secret is changed or deleted (through the manager's
// cache, which holds the operator's labelled Secrets).
func (s *serviceIdentity) watchSecret(ctx context.Context) error {
	if s.b.cfg.Cache == nil {
		return nil
	}
	inf, err := s.b.cfg.Cache.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("watch the service credentials secret: %w", err)
	}
	ours := func(obj any) bool {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		o, ok := obj.(client.Object)
		return ok && o.GetNamespace() == s.key.Namespace && o.GetName() == s.key.Name
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if ours(obj) {
				s.trigger()
			}
		},
		DeleteFunc: func(obj any) {
			if ours(obj) {
				s.trigger()
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch the service credentials secret: %w", err)
	}
	return nil
}

// run repairs until ctx ends.
func (s *serviceIdentity) run(ctx context.Context) {
	log := s.b.log.WithValues("secret", s.key.String(), "username", identity.ServiceUsername)
	delay := time.Second
	first, failing := true, false
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rep, secret, err := EnsureServiceIdentity(rctx, s.b.cfg.Client, s.b.cfg.Backend, s.key)
		cancel()
		next := jittered(s.b.cfg.ServiceResync)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			log.Info("conversation service identity not in sync; retrying", "err", err.Error(), "in", delay)
			if !failing { // once per failure streak, not per retry
				s.event(secret, corev1.EventTypeWarning, EventServiceIdentityFailed, "broker identity of the conversation service could not be ensured: %v", err)
			}
			failing = true
			s.sleep(ctx, delay)
			delay = min(2*delay, time.Minute)
			continue
		case first:
			delay = time.Second
			log.Info("conversation service identity in place", "changed", rep.Changed(), "commands", acl.Summary(rep.Commands))
			if rep.Changed() {
				s.event(secret, corev1.EventTypeNormal, EventServiceIdentityCreated, "broker identity %s ensured (%s)", identity.ServiceUsername, describe(rep))
			}
			first = false
		case rep.Changed():
			delay = time.Second
			log.Info("repaired the conversation service identity", "commands", acl.Summary(rep.Commands), "secretCreated", rep.SecretCreated, "passwordSet", rep.PasswordSet)
			reason := EventServiceIdentityRepaired
			if rep.SecretCreated {
				reason = EventServiceCredentialsNew
			}
			s.event(secret, corev1.EventTypeWarning, reason, "broker identity %s repaired (%s)", identity.ServiceUsername, describe(rep))
		default:
			delay = time.Second
		}
		failing = false
		s.sleep(ctx, next)
	}
}

func (s *serviceIdentity) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	case <-s.wake:
	}
}

func describe(rep ServiceRepair) string {
	out := "broker in sync"
	if len(rep.Commands) > 0 {
		out = "broker commands: " + acl.Summary(rep.Commands)
	}
	if rep.SecretCreated {
		out += "; the credentials Secret was missing and was written with a new password: restart the conversation service if it does not reread it"
	}
	if rep.PasswordSet {
		out += "; the broker was given the new password"
	}
	return out
}

func (s *serviceIdentity) event(secret *corev1.Secret, eventType, reason, format string, args ...any) {
	if s.b.cfg.Recorder == nil || secret == nil || secret.UID == "" {
		return
	}
	s.b.cfg.Recorder.Eventf(secret, nil, eventType, reason, "EnsureServiceIdentity", format, args...)
}

// jittered returns d ±20 %, so periodic checks of many operators do not align.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}
