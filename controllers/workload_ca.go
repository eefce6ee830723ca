package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// workloadCA is the PEM CA bundle that verifies the workloads' broker, read from a file (the
// operator's --workload-broker-ca-file, typically a mounted Secret that cert-manager rotates). It
// is read again at every use: a rotated bundle reaches each Agent's credentials Secret at the
// Agent's next reconcile, without a restart. A file that is momentarily unreadable (a Secret
// volume being swapped) yields the last bundle read.
type workloadCA struct {
	path string
	mu   sync.Mutex
	last []byte
}

// newWorkloadCA is the bundle of path; nil (no CA) when path is empty.
func newWorkloadCA(path string) *workloadCA {
	if path == "" {
		return nil
	}
	return &workloadCA{path: path}
}

// pem returns the current bundle; nil without a CA.
func (c *workloadCA) pem() ([]byte, error) {
	if c == nil {
		return nil, nil
	}
	raw, err := os.ReadFile(c.path)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || len(raw) == 0 {
		if c.last != nil {
			return c.last, nil
		}
		if err == nil {
			err = fmt.Errorf("%s is empty", c.path)
		}
		return nil, fmt.Errorf("read the workloads' broker CA: %w", err)
	}
	c.last = raw
	return raw, nil
}

// DefaultWorkloadCAPoll is how often the workload broker CA file is looked at when
// Options.WorkloadBrokerCAPoll is zero.
const DefaultWorkloadCAPoll = 10 * time.Second

// workloadCAWatch writes a changed workload broker CA into every Agent's credentials Secret as
// soon as the file changes (within one poll), instead of at each Agent's next reconcile (up to a
// resync period). The file is polled rather than watched with inotify: a mounted Secret changes
// by a symlink swap in its folder, which a watch on the file misses, and a read every few
// seconds of a small file costs nothing. It runs on the leader only (a manager Runnable).
type workloadCAWatch struct {
	ca     *workloadCA
	client client.Client
	period time.Duration
}

// Start polls until ctx ends; a propagation that fails is tried again at the next poll.
func (w *workloadCAWatch) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("workload-broker-ca")
	last, _ := w.ca.pem()
	ticker := time.NewTicker(w.period)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		current, err := w.ca.pem()
		if err != nil || bytes.Equal(current, last) {
			continue
		}
		n, err := w.propagate(ctx, current)
		if err != nil {
			log.Error(err, "could not write the new broker CA into every credentials Secret; trying again", "written", n)
			continue
		}
		log.Info("wrote the new broker CA into the credentials Secrets", "secrets", n)
		last = current
	}
}

// propagate writes caPEM into every credentials Secret of an Agent that holds another one.
func (w *workloadCAWatch) propagate(ctx context.Context, caPEM []byte) (int, error) {
	var secrets corev1.SecretList
	if err := w.client.List(ctx, &secrets, client.MatchingLabels{identity.LabelManagedBy: identity.ManagedByValue},
		client.HasLabels{identity.LabelAgent}); err != nil {
		return 0, fmt.Errorf("list credentials secrets: %w", err)
	}
	written := 0
	var errs []error
	for i := range secrets.Items {
		s := &secrets.Items[i]
		owner := metav1.GetControllerOf(s)
		if owner == nil || owner.Kind != "Agent" || owner.APIVersion != a2av1.GroupVersion.String() {
			continue
		}
		changed, err := syncSecretCA(ctx, w.client, s, caPEM)
		if err != nil {
			errs = append(errs, err)
		} else if changed {
			written++
		}
	}
	return written, errors.Join(errs...)
}

// syncSecretCA makes the Secret's CA (identity.SecretKeyCA) the one given (none: no key). Only that
// key changes, with a merge patch: the password, its marks, the credentials checksum and so the
// workload's pods stay as they are (the SDK re-reads the CA file at every TLS handshake), and no
// Event is recorded (nothing about the Agent's credentials changed).
func syncSecretCA(ctx context.Context, c client.Client, secret *corev1.Secret, caPEM []byte) (changed bool, err error) {
	have, present := secret.Data[identity.SecretKeyCA]
	if bytes.Equal(have, caPEM) && present == (caPEM != nil) {
		return false, nil
	}
	var value any // JSON null removes the key
	if caPEM != nil {
		value = caPEM // []byte marshals as base64, the encoding of a Secret's data
	}
	patch, err := json.Marshal(map[string]any{"data": map[string]any{identity.SecretKeyCA: value}})
	if err != nil {
		return false, fmt.Errorf("broker CA patch: %w", err)
	}
	if err := c.Patch(ctx, secret, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("write the broker CA into credentials secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	ctrl.LoggerFrom(ctx).V(1).Info("updated the broker CA of the credentials secret", "secret", secret.Name)
	return true, nil
}
