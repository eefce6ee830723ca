package registration

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// EnsureServiceCredentials gives the conversation service its broker identity and keeps its
// password in the Secret secretKey (keys username and password), creating the Secret when it is
// missing. It is idempotent: with the Secret in place and the broker in sync it sends nothing.
func EnsureServiceCredentials(ctx context.Context, c client.Client, backend acl.Backend, secretKey client.ObjectKey) error {
	secret := &corev1.Secret{}
	err := c.Get(ctx, secretKey, secret)
	created := false
	switch {
	case apierrors.IsNotFound(err):
		password, err := identity.NewPassword()
		if err != nil {
			return fmt.Errorf("service credentials: %w", err)
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
			return fmt.Errorf("create service credentials secret: %w", err)
		}
		created = true
	case err != nil:
		return fmt.Errorf("get service credentials secret: %w", err)
	}
	password := string(secret.Data[identity.SecretKeyPassword])

	only := ServiceNames()
	observed, err := backend.Observe(ctx, &only)
	if err != nil {
		return fmt.Errorf("observe service group: %w", err)
	}
	res, err := acl.Apply(ctx, backend, acl.Desired{
		State:     ServiceIdentity(observed),
		Passwords: map[string]string{identity.ServiceUsername: password},
	})
	if err != nil {
		return fmt.Errorf("apply service identity: %w", err)
	}
	if created && !createdClient(res, identity.ServiceUsername) {
		// A new Secret for an existing broker client: the broker must learn the new password.
		if err := acl.SetPassword(ctx, backend, identity.ServiceUsername, password); err != nil {
			return fmt.Errorf("set service password: %w", err)
		}
	}
	return nil
}

// ServiceCredentialsRunnable keeps trying EnsureServiceCredentials (with backoff) until it
// succeeds, on the leader only, so the operator starts while the broker is down.
func ServiceCredentialsRunnable(c client.Client, backend acl.Backend, secretKey client.ObjectKey) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		log := logf.FromContext(ctx).WithName("conversation-service-credentials")
		delay := time.Second
		for {
			err := EnsureServiceCredentials(ctx, c, backend, secretKey)
			if err == nil {
				log.Info("conversation service identity in place", "secret", secretKey.String())
				return nil
			}
			log.Error(err, "ensure conversation service identity; retrying", "in", delay)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Minute)
		}
	})
}
