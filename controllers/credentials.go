package controllers

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Keys of the credentials Secret; workloads read them through env vars.
const (
	SecretKeyUsername = "username"
	SecretKeyPassword = "password"
	SecretKeyClientID = "clientID"
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

// Credentials are an Agent's broker credentials.
type Credentials struct {
	Username, Password, ClientID string
	// PasswordChanged is true when the broker does not yet have Password.
	PasswordChanged bool
}

// BrokerUsername is the broker username of an Agent: its Client ID under the prefix that marks
// the broker objects the operator owns (so hand-made broker users are never touched).
func BrokerUsername(agent *a2av1.Agent) string {
	return acl.DefaultPrefix + AgentIdentity(agent).ClientID()
}

// CredentialsSecretName is the name of the Secret holding an Agent's broker credentials.
func CredentialsSecretName(agent *a2av1.Agent) string {
	return agent.Name + "-mqtt-credentials"
}

// ensureCredentials creates the Agent's credentials Secret, or rotates its password when the
// Agent's rotation annotation has a new value, and returns the credentials.
func (r *AgentReconciler) ensureCredentials(ctx context.Context, agent *a2av1.Agent) (Credentials, error) {
	clientID := AgentIdentity(agent).ClientID()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: CredentialsSecretName(agent), Namespace: agent.Namespace}}
	err := r.Get(ctx, client.ObjectKeyFromObject(secret), secret)
	if err != nil && !apierrors.IsNotFound(err) {
		return Credentials{}, fmt.Errorf("get credentials secret: %w", err)
	}
	exists := err == nil
	if exists && !metav1.IsControlledBy(secret, agent) {
		return Credentials{}, fmt.Errorf("secret %s exists and is not owned by this Agent; refusing to overwrite it", secret.Name)
	}

	wantRotation := agent.Annotations[AnnotationRotateCredentials]
	needPassword := !exists || len(secret.Data[SecretKeyPassword]) == 0 ||
		(wantRotation != "" && secret.Annotations[annotationRotatedFor] != wantRotation)
	username := BrokerUsername(agent)
	if exists && !needPassword && string(secret.Data[SecretKeyClientID]) == clientID && string(secret.Data[SecretKeyUsername]) == username {
		synced := secret.Annotations[annotationPasswordSynced] == "true"
		if !synced {
			// The cache may not have seen our own "synced" mark yet; ask the API server before
			// pushing the password to the broker a second time.
			fresh := &corev1.Secret{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(secret), fresh); err != nil {
				return Credentials{}, fmt.Errorf("get credentials secret: %w", err)
			}
			synced = fresh.Annotations[annotationPasswordSynced] == "true" &&
				string(fresh.Data[SecretKeyPassword]) == string(secret.Data[SecretKeyPassword])
		}
		return Credentials{
			Username:        string(secret.Data[SecretKeyUsername]),
			Password:        string(secret.Data[SecretKeyPassword]),
			ClientID:        clientID,
			PasswordChanged: !synced,
		}, nil
	}

	password := string(secret.Data[SecretKeyPassword])
	if needPassword {
		if password, err = newPassword(); err != nil {
			return Credentials{}, err
		}
	}
	secret.Type = corev1.SecretTypeOpaque
	secret.Data = map[string][]byte{
		SecretKeyUsername: []byte(username),
		SecretKeyPassword: []byte(password),
		SecretKeyClientID: []byte(clientID),
	}
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations[annotationRotatedFor] = wantRotation
	secret.Annotations[annotationPasswordSynced] = "false"
	if secret.Labels == nil {
		secret.Labels = map[string]string{}
	}
	secret.Labels[LabelManagedBy] = ManagedByValue
	secret.Labels[LabelAgent] = agent.Name
	if err := controllerutil.SetControllerReference(agent, secret, r.Scheme()); err != nil {
		return Credentials{}, fmt.Errorf("own credentials secret: %w", err)
	}
	if exists {
		err = r.Update(ctx, secret)
	} else {
		err = r.Create(ctx, secret)
	}
	if err != nil {
		return Credentials{}, fmt.Errorf("write credentials secret: %w", err)
	}
	if needPassword && exists {
		r.Recorder.Eventf(agent, nil, corev1.EventTypeNormal, EventCredentialsRotated, "RotateCredentials",
			"generated a new broker password in Secret %s", secret.Name)
	}
	return Credentials{Username: username, Password: password, ClientID: clientID, PasswordChanged: true}, nil
}

// markPasswordSynced records that the broker has the Secret's current password. A merge patch by
// name needs no read, so it cannot fail on a cache that has not seen the Secret yet.
func (r *AgentReconciler) markPasswordSynced(ctx context.Context, agent *a2av1.Agent) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agent.Namespace, Name: CredentialsSecretName(agent)}}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true"}}}`, annotationPasswordSynced)
	if err := r.Patch(ctx, secret, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("mark password synced: %w", err)
	}
	return nil
}

// newPassword returns 32 random bytes, URL-safe base64 encoded (256 bits of entropy).
func newPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
