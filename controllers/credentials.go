package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	// AnnotationCredentialsChecksum on the workload's pod template is a digest of the credentials,
	// so that a rotation or a re-created Secret rolls the Deployment.
	AnnotationCredentialsChecksum = "a2a.fleet.dev/credentials-checksum"
	// annotationRotatedFor on the Secret records the rotation request it satisfies.
	annotationRotatedFor = "a2a.fleet.dev/rotated-for"
	// annotationPasswordSynced on the Secret is "true" when the broker has the Secret's password.
	// The operator gives the broker a new password before it writes it to the Secret, so Secrets it
	// writes carry "true"; "false" (from older versions, or written by hand) makes the next
	// reconcile push the Secret's password again.
	annotationPasswordSynced = "a2a.fleet.dev/password-synced"
)

// credentialsConflictError: a Secret with the credentials' name exists and is not the Agent's.
type credentialsConflictError struct{ name string }

func (e *credentialsConflictError) Error() string {
	return fmt.Sprintf("Secret %s exists and is not owned by this Agent; the operator will not overwrite it: delete or rename it", e.name)
}

// pendingCredentials are the Agent's credentials for this reconcile and, when they are new, the
// Secret write that makes them durable once the broker has them.
type pendingCredentials struct {
	creds  registration.Credentials
	secret *corev1.Secret
	// write is "" (nothing to write), "create" or "update".
	write string
	// event is the Event reason recorded once the write succeeded.
	event, eventNote string
	// markSynced: the Secret's password was written by hand or by an older version and is not
	// known to be on the broker; mark it once Register has pushed it.
	markSynced bool
}

// checksum is the digest of the credentials put into the workload's pod template.
func (p *pendingCredentials) checksum() string {
	sum := sha256.Sum256([]byte(p.creds.Username + "\x00" + p.creds.Password + "\x00" + p.creds.ClientID))
	return hex.EncodeToString(sum[:8])
}

// prepareCredentials reads the Agent's credentials Secret and decides what this reconcile does
// with it: keep it, or generate a new password (no Secret yet, the Secret was deleted, or a
// rotation was asked for). Nothing is written here: persist writes after the broker has the
// password, so a Secret never holds a password the broker refuses (and one API write is saved).
func (r *AgentReconciler) prepareCredentials(ctx context.Context, agent *a2av1.Agent) (*pendingCredentials, error) {
	clientID := identity.Of(agent).ClientID()
	username := identity.BrokerUsername(agent)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: identity.CredentialsSecretName(agent), Namespace: agent.Namespace}}
	err := r.Get(ctx, client.ObjectKeyFromObject(secret), secret)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get credentials secret: %w", err)
	}
	exists := err == nil
	if !exists {
		// The cache holds only Secrets with our label: make sure no foreign one has the name.
		foreign := &corev1.Secret{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(secret), foreign); err == nil {
			if !metav1.IsControlledBy(foreign, agent) {
				return nil, &credentialsConflictError{name: secret.Name}
			}
			secret, exists = foreign, true
		} else if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get credentials secret: %w", err)
		}
	}
	if exists && !metav1.IsControlledBy(secret, agent) {
		return nil, &credentialsConflictError{name: secret.Name}
	}

	wantRotation := agent.Annotations[AnnotationRotateCredentials]
	needsPassword := func(s *corev1.Secret) bool {
		return len(s.Data[identity.SecretKeyPassword]) == 0 || (wantRotation != "" && s.Annotations[annotationRotatedFor] != wantRotation)
	}
	needPassword := !exists || needsPassword(secret)
	if exists && needPassword {
		// A new password goes to the broker before the Secret: decide on the API server's copy,
		// never on a cache that may not have seen our last write yet (that would push a password
		// the Secret update then fails to store).
		fresh := &corev1.Secret{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(secret), fresh); err != nil {
			return nil, fmt.Errorf("get credentials secret: %w", err)
		}
		secret, needPassword = fresh, needsPassword(fresh)
	}
	if exists && !needPassword && string(secret.Data[identity.SecretKeyClientID]) == clientID && string(secret.Data[identity.SecretKeyUsername]) == username {
		synced := secret.Annotations[annotationPasswordSynced] == "true"
		if !synced {
			// The cache may not have seen our own "synced" mark yet; ask the API server before
			// pushing the password to the broker a second time.
			fresh := &corev1.Secret{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(secret), fresh); err != nil {
				return nil, fmt.Errorf("get credentials secret: %w", err)
			}
			synced = fresh.Annotations[annotationPasswordSynced] == "true" &&
				string(fresh.Data[identity.SecretKeyPassword]) == string(secret.Data[identity.SecretKeyPassword])
		}
		agent.Status.CredentialsSecret = secret.Name
		return &pendingCredentials{
			creds: registration.Credentials{Username: username, Password: string(secret.Data[identity.SecretKeyPassword]),
				ClientID: clientID, PasswordChanged: !synced},
			markSynced: !synced,
		}, nil
	}

	password := string(secret.Data[identity.SecretKeyPassword])
	p := &pendingCredentials{secret: secret, write: "update"}
	switch {
	case !exists && agent.Status.CredentialsSecret != "":
		p.write, p.event, p.eventNote = "create", EventCredentialsRecreate, "Secret %s was deleted: generated a new broker password (workloads roll to it)"
	case !exists:
		p.write, p.event, p.eventNote = "create", EventCredentialsCreated, "generated broker credentials in Secret %s"
	case needPassword:
		p.event, p.eventNote = EventCredentialsRotated, "generated a new broker password in Secret %s (workloads roll to it)"
	default:
		p.event, p.eventNote = EventCredentialsRotated, "rewrote the identity in Secret %s"
	}
	if needPassword {
		if password, err = identity.NewPassword(); err != nil {
			return nil, err
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
	secret.Annotations[annotationPasswordSynced] = "true"
	if secret.Labels == nil {
		secret.Labels = map[string]string{}
	}
	secret.Labels[identity.LabelManagedBy] = identity.ManagedByValue
	secret.Labels[identity.LabelAgent] = agent.Name
	if err := controllerutil.SetControllerReference(agent, secret, r.Scheme()); err != nil {
		return nil, fmt.Errorf("own credentials secret: %w", err)
	}
	agent.Status.CredentialsSecret = secret.Name
	p.creds = registration.Credentials{Username: username, Password: password, ClientID: clientID, PasswordChanged: true}
	return p, nil
}

// persist writes what prepareCredentials decided, once the broker has the password.
func (p *pendingCredentials) persist(ctx context.Context, r *AgentReconciler, agent *a2av1.Agent) error {
	var err error
	switch p.write {
	case "create":
		err = r.Create(ctx, p.secret)
	case "update":
		err = r.Update(ctx, p.secret)
	case "":
		if p.markSynced {
			return r.markPasswordSynced(ctx, agent)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("write credentials secret: %w", err)
	}
	p.write, p.creds.PasswordChanged = "", false
	r.Recorder.Eventf(agent, nil, corev1.EventTypeNormal, p.event, "Credentials", p.eventNote, p.secret.Name)
	return nil
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

// revokeCredentials deletes the Agent's credentials Secret, if it has one: an Agent that does not
// hold its identity (not permitted, or the loser of a conflict) must not keep a password for it.
func (r *AgentReconciler) revokeCredentials(ctx context.Context, agent *a2av1.Agent, why string) error {
	agent.Status.CredentialsSecret = ""
	secret := &corev1.Secret{}
	err := r.Get(ctx, client.ObjectKey{Namespace: agent.Namespace, Name: identity.CredentialsSecretName(agent)}, secret)
	if apierrors.IsNotFound(err) || (err == nil && !metav1.IsControlledBy(secret, agent)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get credentials secret: %w", err)
	}
	if err := r.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete credentials secret: %w", err)
	}
	r.Recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventCredentialsRevoked, "Credentials",
		"deleted Secret %s: %s", secret.Name, why)
	return nil
}
