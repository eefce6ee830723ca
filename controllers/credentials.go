package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
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
	// annotationPasswordStaged on the Secret (RFC 3339) marks a new password that waits in the
	// Secret for the workload's old pods to go: they still run with the old password, which the
	// broker keeps until then (a staged rotation, see stageRotation). It goes when the broker
	// gets the new password.
	annotationPasswordStaged = "a2a.fleet.dev/password-staged"
)

// Events of a staged rotation.
const (
	// EventCredentialsActivated: the broker now accepts only the new password (the workload's old
	// pods are gone).
	EventCredentialsActivated = "CredentialsActivated"
	// EventCredentialsRolloutTimeout: the old pods did not go in time; the broker got the new
	// password anyway (a rotation must end: the old password is revoked), disconnecting them.
	EventCredentialsRolloutTimeout = "CredentialsRolloutTimedOut"
)

// Timing of a staged rotation: how often the Deployment is looked at while the old pods drain
// (its status changes wake the Agent too; this is the safety net), and how long after the pods'
// termination grace period the broker keeps the old password at most.
const (
	stagedRotationRecheck = 5 * time.Second
	stagedRotationSlack   = 2 * time.Minute
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
	// event is the Event reason recorded once the write succeeded (none for a new Agent's first
	// credentials).
	event, eventNote string
	// markSynced: the Secret's password is not known to be on the broker (written by hand, by an
	// older version, or staged for a workload whose old pods are gone now); mark it once Register
	// has pushed it.
	markSynced bool
	// activated is the Event recorded once a staged password is on the broker ("" when none).
	activated, activatedType, activatedNote string
	// recheck > 0: a staged password waits for the workload's old pods; look again this soon.
	recheck time.Duration
}

// checksum is the digest of the credentials put into the workload's pod template.
func (p *pendingCredentials) checksum() string {
	sum := sha256.Sum256([]byte(p.creds.Username + "\x00" + p.creds.Password + "\x00" + p.creds.ClientID))
	return hex.EncodeToString(sum[:8])
}

// requeue shortens result to the staged rotation's recheck, when one waits.
func (p *pendingCredentials) requeue(result ctrl.Result) ctrl.Result {
	if p != nil && p.recheck > 0 && (result.RequeueAfter <= 0 || p.recheck < result.RequeueAfter) {
		result.RequeueAfter = p.recheck
	}
	return result
}

// agentCredentials keeps an Agent's credentials Secret: it decides, per reconcile, whether the
// Secret's password stays or a new one is generated (pendingCredentials), writes it once the
// broker has it, stages a rotation while the workload's old pods still use the old password, and
// revokes the Secret of an Agent that does not hold its identity.
type agentCredentials struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	metrics   *metrics
	// withBroker: a broker gets the passwords (a rotation can be staged).
	withBroker bool
	// ca, when set, is the broker CA every credentials Secret carries (identity.SecretKeyCA).
	ca *workloadCA
}

// prepare reads the Agent's credentials Secret and decides what this reconcile does with it:
// keep it, or generate a new password (no Secret yet, the Secret was deleted, or a rotation was
// asked for). Nothing is written here: persist writes after the broker has the password, so a
// Secret never holds a password the broker refuses (and one API write is saved).
//
// The exception is a staged rotation (stageRotation): when the Agent's workload runs pods with
// the old password, the new one goes into the Secret first (marked not synced), the Deployment
// rolls (Recreate: the old pods drain and go before new ones start), and only then does the
// broker get it; the new pods' refused CONNECTs retry meanwhile.
//
// first says the operator has written nothing for the Agent yet (isFirstReconcile, secretOf).
func (u *agentCredentials) prepare(ctx context.Context, agent *a2av1.Agent, first bool) (*pendingCredentials, error) {
	secret, exists, err := u.secretOf(ctx, agent, first && agent.Status.CredentialsSecret == "")
	if err != nil {
		return nil, err
	}
	caPEM, err := u.ca.pem()
	if err != nil {
		return nil, err
	}
	wantRotation := agent.Annotations[AnnotationRotateCredentials]
	needPassword := !exists || needsPassword(secret, wantRotation)
	if exists && needPassword {
		// A new password goes to the broker before the Secret: decide on the API server's copy,
		// never on a cache that may not have seen our last write yet (that would push a password
		// the Secret update then fails to store).
		if secret, err = u.fresh(ctx, secret); err != nil {
			return nil, err
		}
		needPassword = needsPassword(secret, wantRotation)
	}
	if exists && !needPassword && string(secret.Data[identity.SecretKeyClientID]) == identity.Of(agent).ClientID() &&
		string(secret.Data[identity.SecretKeyUsername]) == identity.BrokerUsername(agent) {
		if _, err := syncSecretCA(ctx, u.client, secret, caPEM); err != nil {
			return nil, err
		}
		return u.keep(ctx, agent, secret)
	}
	return u.generate(ctx, agent, secret, exists, needPassword, caPEM)
}

// needsPassword: the Secret has no password, or a rotation was asked for that it does not
// satisfy yet.
func needsPassword(s *corev1.Secret, wantRotation string) bool {
	return len(s.Data[identity.SecretKeyPassword]) == 0 || (wantRotation != "" && s.Annotations[annotationRotatedFor] != wantRotation)
}

// secretOf reads the Agent's credentials Secret (exists false: none, and secret is the one to
// create). A Secret of that name that is not the Agent's is a credentialsConflictError.
//
// The cache holds only the operator's Secrets; a name it does not hold is looked up on the API
// server, for a foreign Secret, except for a new Agent (isNew: its first reconcile, no Secret
// recorded): the operator has written none for it, and a foreign one makes the Secret's create
// fail (persist), which says so. A rollout then reads no Secret from the API server.
func (u *agentCredentials) secretOf(ctx context.Context, agent *a2av1.Agent, isNew bool) (secret *corev1.Secret, exists bool, err error) {
	key := client.ObjectKey{Namespace: agent.Namespace, Name: identity.CredentialsSecretName(agent)}
	secret = &corev1.Secret{}
	err = u.client.Get(ctx, key, secret)
	if apierrors.IsNotFound(err) && !isNew {
		// The cache holds only Secrets with our label: make sure no foreign one has the name.
		err = u.apiReader.Get(ctx, key, secret)
	}
	switch {
	case apierrors.IsNotFound(err):
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("get credentials secret: %w", err)
	case !metav1.IsControlledBy(secret, agent):
		return nil, false, &credentialsConflictError{name: key.Name}
	}
	return secret, true, nil
}

// fresh reads secret again from the API server, around the cache.
func (u *agentCredentials) fresh(ctx context.Context, secret *corev1.Secret) (*corev1.Secret, error) {
	fresh := &corev1.Secret{}
	if err := u.apiReader.Get(ctx, client.ObjectKeyFromObject(secret), fresh); err != nil {
		return nil, fmt.Errorf("get credentials secret: %w", err)
	}
	return fresh, nil
}

// keep uses the Secret's password as it is; the broker is given it again when it is not known to
// have it (or a staged password's wait is over).
func (u *agentCredentials) keep(ctx context.Context, agent *a2av1.Agent, secret *corev1.Secret) (*pendingCredentials, error) {
	synced := secret.Annotations[annotationPasswordSynced] == "true"
	staged := ""
	if !synced {
		// The cache may not have seen our own "synced" mark yet; ask the API server before
		// pushing the password to the broker a second time.
		fresh, err := u.fresh(ctx, secret)
		if err != nil {
			return nil, err
		}
		synced = fresh.Annotations[annotationPasswordSynced] == "true" &&
			string(fresh.Data[identity.SecretKeyPassword]) == string(secret.Data[identity.SecretKeyPassword])
		staged = fresh.Annotations[annotationPasswordStaged]
	}
	agent.Status.CredentialsSecret = secret.Name
	p := &pendingCredentials{
		creds: registration.Credentials{Username: identity.BrokerUsername(agent), Password: string(secret.Data[identity.SecretKeyPassword]),
			ClientID: identity.Of(agent).ClientID(), PasswordChanged: !synced},
		markSynced: !synced,
	}
	if !synced && staged != "" {
		if err := u.finishStagedRotation(ctx, agent, secret.Name, staged, p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// generate writes the identity (and, when needPassword, a new password) into secret, to be
// persisted once the broker has it, or at once when the rotation is staged.
func (u *agentCredentials) generate(ctx context.Context, agent *a2av1.Agent, secret *corev1.Secret, exists, needPassword bool, caPEM []byte) (*pendingCredentials, error) {
	password := string(secret.Data[identity.SecretKeyPassword])
	// A new password for an identity the broker already has (a rotation, a deleted Secret)
	// while the workload runs pods with the old one: staged.
	// (Without a broker there is nothing to stage.)
	recorded := agent.Status.CredentialsSecret != ""
	staged := false
	if needPassword && (exists || recorded) && u.withBroker {
		var err error
		if staged, err = u.workloadHoldsCredentials(ctx, agent); err != nil {
			return nil, err
		}
	}
	p := &pendingCredentials{secret: secret}
	p.write, p.event, p.eventNote = credentialsWrite(exists, recorded, needPassword, staged)
	if needPassword {
		var err error
		if password, err = identity.NewPassword(); err != nil {
			return nil, err
		}
	}
	if err := u.fill(agent, secret, password, caPEM, staged); err != nil {
		return nil, err
	}
	agent.Status.CredentialsSecret = secret.Name
	// A staged password stays off the broker for now: the old pods keep their connections and
	// finish their work. (If the broker has no client for the identity at all, Register creates
	// it with this password: nothing runs with the old one there.)
	p.creds = registration.Credentials{Username: identity.BrokerUsername(agent), Password: password,
		ClientID: identity.Of(agent).ClientID(), PasswordChanged: !staged}
	if staged {
		p.recheck = stagedRotationRecheck
	}
	return p, nil
}

// credentialsWrite is the Secret write of new credentials ("create" or "update") and the Event it
// is reported with (none for a new Agent's first credentials). recorded: status names a Secret
// the Agent had.
func credentialsWrite(exists, recorded, needPassword, staged bool) (write, event, note string) {
	suffix := ""
	if staged {
		suffix = " (the workload rolls to it; the broker keeps the old one until its old pods are gone)"
	}
	switch {
	case !exists && recorded:
		return "create", EventCredentialsRecreate, "Secret %s was deleted: generated a new broker password" + suffix
	case !exists:
		// A new Agent's first credentials are what applying it means, and status.credentialsSecret
		// says so: an Event per Agent of a fleet rollout would cost the API server a write (~5 % of
		// its CPU per Agent, docs/benchmarks.md) and the operator its event cache, and tell nobody
		// anything. Changes to credentials that exist (below) are news.
		return "create", "", ""
	case needPassword:
		return "update", EventCredentialsRotated, "generated a new broker password in Secret %s" + suffix
	}
	return "update", EventCredentialsRotated, "rewrote the identity in Secret %s"
}

// fill sets the Secret's data (with the broker CA, when there is one), marks and ownership.
func (u *agentCredentials) fill(agent *a2av1.Agent, secret *corev1.Secret, password string, caPEM []byte, staged bool) error {
	secret.Type = corev1.SecretTypeOpaque
	secret.Data = map[string][]byte{
		identity.SecretKeyUsername: []byte(identity.BrokerUsername(agent)),
		identity.SecretKeyPassword: []byte(password),
		identity.SecretKeyClientID: []byte(identity.Of(agent).ClientID()),
	}
	if caPEM != nil {
		secret.Data[identity.SecretKeyCA] = caPEM
	}
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations[annotationRotatedFor] = agent.Annotations[AnnotationRotateCredentials]
	secret.Annotations[annotationPasswordSynced] = "true"
	delete(secret.Annotations, annotationPasswordStaged)
	if staged {
		secret.Annotations[annotationPasswordSynced] = "false"
		secret.Annotations[annotationPasswordStaged] = time.Now().UTC().Format(time.RFC3339)
	}
	if secret.Labels == nil {
		secret.Labels = map[string]string{}
	}
	secret.Labels[identity.LabelManagedBy] = identity.ManagedByValue
	secret.Labels[identity.LabelAgent] = agent.Name
	if err := controllerutil.SetControllerReference(agent, secret, u.client.Scheme()); err != nil {
		return fmt.Errorf("own credentials secret: %w", err)
	}
	return nil
}

// workloadHoldsCredentials reports whether the Agent's workload runs pods that hold its current
// credentials: its Deployment exists, is the Agent's and wants pods. A new password for it is
// staged (prepare).
func (u *agentCredentials) workloadHoldsCredentials(ctx context.Context, agent *a2av1.Agent) (bool, error) {
	if agent.Spec.Workload == nil {
		return false, nil
	}
	deploy := &appsv1.Deployment{}
	err := u.client.Get(ctx, client.ObjectKey{Namespace: agent.Namespace, Name: WorkloadName(agent)}, deploy)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get workload deployment: %w", err)
	}
	return metav1.IsControlledBy(deploy, agent) && ptr.Deref(deploy.Spec.Replicas, 1) > 0, nil
}

// finishStagedRotation decides whether a staged password goes to the broker in this reconcile:
// when the workload's Deployment runs only pods with it (rolledOut: with Recreate, every old pod
// has terminated), when there is no workload any more, or when the old pods did not go within
// their termination grace period plus stagedRotationSlack (the old password must not stay valid
// for ever: they are disconnected, with a Warning). Otherwise the broker keeps the old password
// and the Agent is looked at again soon.
func (u *agentCredentials) finishStagedRotation(ctx context.Context, agent *a2av1.Agent, secretName, stagedAt string, p *pendingCredentials) error {
	since, err := time.Parse(time.RFC3339, stagedAt)
	if err != nil {
		since = time.Time{} // unreadable (edited by hand): do not wait
	}
	deploy := &appsv1.Deployment{}
	err = u.client.Get(ctx, client.ObjectKey{Namespace: agent.Namespace, Name: WorkloadName(agent)}, deploy)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get workload deployment: %w", err)
	}
	gone := apierrors.IsNotFound(err) || agent.Spec.Workload == nil || !metav1.IsControlledBy(deploy, agent)
	waited := time.Since(since)
	switch {
	case gone || rolledOut(deploy, p.checksum()):
		p.activated, p.activatedType = EventCredentialsActivated, corev1.EventTypeNormal
		p.activatedNote = fmt.Sprintf("the broker now accepts the new password of Secret %s: the workload's old pods are gone (%s after the rotation)", secretName, waited.Round(100*time.Millisecond))
	case since.IsZero() || waited > stagedRotationTimeout(agent):
		p.activated, p.activatedType = EventCredentialsRolloutTimeout, corev1.EventTypeWarning
		p.activatedNote = fmt.Sprintf("the workload's old pods were still there %s after the rotation: the broker got the new password of Secret %s anyway (the old one is revoked; pods still using it are disconnected)", waited.Round(time.Second), secretName)
	default:
		// Not yet: the broker keeps the old password.
		p.creds.PasswordChanged, p.markSynced = false, false
		p.recheck = min(stagedRotationRecheck, stagedRotationTimeout(agent)-waited+time.Second)
	}
	return nil
}

// stagedRotationTimeout bounds how long the broker keeps an old password for a workload's old
// pods: their termination grace period (the time they may take to finish their work) plus
// stagedRotationSlack for the rollout itself.
func stagedRotationTimeout(agent *a2av1.Agent) time.Duration {
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if w := agent.Spec.Workload; w != nil && w.Template.Spec.TerminationGracePeriodSeconds != nil {
		grace = *w.Template.Spec.TerminationGracePeriodSeconds
	}
	return time.Duration(grace)*time.Second + stagedRotationSlack
}

// persist writes what prepare decided, once the broker has the password.
func (u *agentCredentials) persist(ctx context.Context, agent *a2av1.Agent, p *pendingCredentials) error {
	var err error
	switch p.write {
	case "create":
		err = u.client.Create(ctx, p.secret)
		if apierrors.IsAlreadyExists(err) {
			err = u.createTaken(ctx, agent, p.secret)
		}
	case "update":
		err = u.client.Update(ctx, p.secret)
	case "":
		if p.markSynced {
			if err := u.markPasswordSynced(ctx, agent); err != nil {
				return err
			}
			if p.activated != "" {
				u.recorder.Eventf(agent, nil, p.activatedType, p.activated, "Credentials", "%s", p.activatedNote)
				p.activated = ""
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("write credentials secret: %w", err)
	}
	p.write, p.creds.PasswordChanged = "", false
	if p.event != "" {
		u.recorder.Eventf(agent, nil, corev1.EventTypeNormal, p.event, "Credentials", p.eventNote, p.secret.Name)
		u.metrics.credentialsReplaced(p.event)
	}
	return nil
}

// createTaken handles a Secret create that found the name taken (secretOf did not ask the API
// server for a new Agent): a foreign Secret is a credentialsConflictError; the Agent's own (a
// reconcile that read the Agent before its first status write reached the cache, and the Secret
// before its create did) gets the password the broker has just been given.
func (u *agentCredentials) createTaken(ctx context.Context, agent *a2av1.Agent, secret *corev1.Secret) error {
	found := &corev1.Secret{}
	if err := u.apiReader.Get(ctx, client.ObjectKeyFromObject(secret), found); err != nil {
		return fmt.Errorf("get credentials secret: %w", err)
	}
	if !metav1.IsControlledBy(found, agent) {
		return &credentialsConflictError{name: secret.Name}
	}
	secret.ResourceVersion = found.ResourceVersion
	return u.client.Update(ctx, secret)
}

// markPasswordSynced records that the broker has the Secret's current password (and that no
// password is staged any more). A merge patch by name needs no read, so it cannot fail on a cache
// that has not seen the Secret yet.
func (u *agentCredentials) markPasswordSynced(ctx context.Context, agent *a2av1.Agent) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agent.Namespace, Name: identity.CredentialsSecretName(agent)}}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true",%q:null}}}`, annotationPasswordSynced, annotationPasswordStaged)
	if err := u.client.Patch(ctx, secret, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("mark password synced: %w", err)
	}
	return nil
}

// revoke deletes the Agent's credentials Secret, if it has one: an Agent that does not
// hold its identity (not permitted, or the loser of a conflict) must not keep a password for it.
func (u *agentCredentials) revoke(ctx context.Context, agent *a2av1.Agent, why string) error {
	agent.Status.CredentialsSecret = ""
	secret := &corev1.Secret{}
	err := u.client.Get(ctx, client.ObjectKey{Namespace: agent.Namespace, Name: identity.CredentialsSecretName(agent)}, secret)
	if apierrors.IsNotFound(err) || (err == nil && !metav1.IsControlledBy(secret, agent)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get credentials secret: %w", err)
	}
	if err := u.client.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete credentials secret: %w", err)
	}
	u.recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventCredentialsRevoked, "Credentials",
		"deleted Secret %s: %s", secret.Name, why)
	return nil
}
