package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

const (
	// AnnotationRotateCredentials on an Agent asks for a new password: set it to any new value
	// (a timestamp, say); the operator rotates once per distinct value.
	AnnotationRotateCredentials = "a2a.fleet.dev/rotate-credentials"
	// annotationRotatedFor on the Secret records the rotation request it satisfies.
	annotationRotatedFor = "a2a.fleet.dev/rotated-for"
	// annotationPasswordSynced on the Secret is "true" once the broker has the Secret's password.
	// It is reset to "false" whenever the password changes, so a crash between the two writes
	// makes the next reconcile push the password again instead of leaving the broker stale.
	annotationPasswordSynced = "a2a.fleet.dev/password-synced"
)

// ensureCredentials creates the Agent's credentials Secret, or rotates its password when the
// Agent's rotation annotation has a new value, and returns the credentials.
func (r *AgentReconciler) ensureCredentials(ctx context.Context, agent *a2av1.Agent) (registration.Credentials, error) {
	clientID := identity.Of(agent).ClientID()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: identity.CredentialsSecretName(agent), Namespace: agent.Namespace}}
	err := r.Get(ctx, client.ObjectKeyFromObject(secret), secret)
	if err != nil && !apierrors.IsNotFound(err) {
		return registration.Credentials{}, fmt.Errorf("get credentials secret: %w", err)
	}
	exists := err == nil
	if exists && !metav1.IsControlledBy(secret, agent) {
		return registration.Credentials{}, fmt.Errorf("secret %s exists and is not owned by this Agent; refusing to overwrite it", secret.Name)
	}

	wantRotation := agent.Annotations[AnnotationRotateCredentials]
	needPassword := !exists || len(secret.Data[identity.SecretKeyPassword]) == 0 ||
		(wantRotation != "" && secret.Annotations[annotationRotatedFor] != wantRotation)
	username := identity.BrokerUsername(agent)
	if exists && !needPassword && string(secret.Data[identity.SecretKeyClientID]) == clientID && string(secret.Data[identity.SecretKeyUsername]) == username {
		synced := secret.Annotations[annotationPasswordSynced] == "true"
		if !synced {
			// The cache may not have seen our own "synced" mark yet; ask the API server before
			// pushing the password to the broker a second time.
			fresh := &corev1.Secret{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(secret), fresh); err != nil {
				return registration.Credentials{}, fmt.Errorf("get credentials secret: %w", err)
			}
			synced = fresh.Annotations[annotationPasswordSynced] == "true" &&
				string(fresh.Data[identity.SecretKeyPassword]) == string(secret.Data[identity.SecretKeyPassword])
		}
		return registration.Credentials{
			Username:        string(secret.Data[identity.SecretKeyUsername]),
			Password:        string(secret.Data[identity.SecretKeyPassword]),
			ClientID:        clientID,
			PasswordChanged: !synced,
		}, nil
	}

	password := string(secret.Data[identity.SecretKeyPassword])
	if needPassword {
		if password, err = identity.NewPassword(); err != nil {
			return registration.Credentials{}, err
		}
	}
	secret.Type = corev1.SecretTypeOpaque
	secret.Data = map[string][]byte{
		identity.SecretKeyUsername: []byte(username),
		identity.SecretKeyPassword: []byte(password),
		identity.SecretKeyClientID: []byte(clientID),
	}
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations[annotationRotatedFor] = wantRotation
	secret.Annotations[annotationPasswordSynced] = "false"
	if secret.Labels == nil {
		secret.Labels = map[string]string{}
	}
	secret.Labels[identity.LabelManagedBy] = identity.ManagedByValue
	secret.Labels[identity.LabelAgent] = agent.Name
	if err := controllerutil.SetControllerReference(agent, secret, r.Scheme()); err != nil {
		return registration.Credentials{}, fmt.Errorf("own credentials secret: %w", err)
	}
	if exists {
		err = r.Update(ctx, secret)
	} else {
		err = r.Create(ctx, secret)
	}
	if err != nil {
		return registration.Credentials{}, fmt.Errorf("write credentials secret: %w", err)
	}
	if needPassword && exists {
		r.Recorder.Eventf(agent, nil, corev1.EventTypeNormal, EventCredentialsRotated, "RotateCredentials",
			"generated a new broker password in Secret %s", secret.Name)
	}
	return registration.Credentials{Username: username, Password: password, ClientID: clientID, PasswordChanged: true}, nil
}

// markPasswordSynced records that the broker has the Secret's current password. A merge patch by
// name needs no read, so it cannot fail on a cache that has not seen the Secret yet.
func (r *AgentReconciler) markPasswordSynced(ctx context.Context, agent *a2av1.Agent) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agent.Namespace, Name: identity.CredentialsSecretName(agent)}}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true"}}}`, annotationPasswordSynced)
	if err := r.Patch(ctx, secret, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("mark password synced: %w", err)
	}
	return nil
}
