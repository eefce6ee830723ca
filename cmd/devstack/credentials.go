package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// credentialsProjection keeps every Agent credentials Secret (the operator's cache holds only
// those) in a folder under the state dir, as the kubelet keeps a mounted Secret: the example agents
// read theirs at every CONNECT (a2amqtt.CredentialsDir), so a rotation reaches them within a
// moment, and a2actl can use one with --credentials-dir instead of copying a password.
type credentialsProjection struct {
	root string
	mu   sync.Mutex
	sums map[string][32]byte
}

// dir is where the Secret namespace/name is kept.
func (p *credentialsProjection) dir(namespace, name string) string {
	return filepath.Join(p.root, namespace, name)
}

func startCredentialsProjection(ctx context.Context, c cache.Cache, root string) (*credentialsProjection, error) {
	p := &credentialsProjection{root: root, sums: map[string][32]byte{}}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("credentials folder: %w", err)
	}
	inf, err := c.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return nil, fmt.Errorf("watch credentials Secrets: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.write(obj) },
		UpdateFunc: func(_, obj any) { p.write(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*corev1.Secret); ok {
				p.mu.Lock()
				delete(p.sums, s.Namespace+"/"+s.Name)
				p.mu.Unlock()
				_ = os.RemoveAll(p.dir(s.Namespace, s.Name))
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watch credentials Secrets: %w", err)
	}
	return p, nil
}

func (p *credentialsProjection) write(obj any) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	h := sha256.New()
	for _, k := range []string{a2amqtt.CredentialsFileUsername, a2amqtt.CredentialsFilePassword, a2amqtt.CredentialsFileClientID} {
		h.Write([]byte(k + "\x00"))
		h.Write(s.Data[k])
		h.Write([]byte{0})
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	key := s.Namespace + "/" + s.Name
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sums[key] == sum {
		return
	}
	if err := a2amqtt.WriteCredentialsDir(p.dir(s.Namespace, s.Name), s.Data); err != nil {
		ctrl.Log.WithName("credentials").Error(err, "keep credentials folder", "secret", key)
		return
	}
	p.sums[key] = sum
}

// ready reports whether the folder of Secret namespace/name holds password.
func (p *credentialsProjection) holds(namespace, name string, password []byte) bool {
	got, err := os.ReadFile(filepath.Join(p.dir(namespace, name), a2amqtt.CredentialsFilePassword))
	return err == nil && string(got) == string(password)
}
