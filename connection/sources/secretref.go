package sources

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/connection"
)

var secretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// secretRefs follows the Secrets that source objects point at. It watches
// only their metadata, so a management cluster's many large Secrets (Helm
// releases, certificates) are not cached, yet a rotated Secret is seen at
// once through its resourceVersion. The data is read with a GET when a
// cluster connects.
type secretRefs struct {
	c   *clients
	inf cache.SharedIndexInformer
}

// newSecretRefs watches the Secrets of one namespace, or of all when
// namespace is empty.
func newSecretRefs(c *clients, w *watcher, namespace string) (*secretRefs, error) {
	f := metadatainformer.NewFilteredSharedInformerFactory(c.metadata, relistEvery, namespace, nil)
	s := &secretRefs{c: c, inf: f.ForResource(secretsGVR).Informer()}
	if err := w.add(s.inf); err != nil {
		return nil, err
	}
	return s, nil
}

// meta returns a Secret's metadata from the cache.
func (s *secretRefs) meta(namespace, name string) (*metav1.PartialObjectMetadata, bool) {
	obj, ok, err := s.inf.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	m, ok := obj.(*metav1.PartialObjectMetadata)
	return m, ok
}

// version identifies a Secret's current content for Claim.Version: its UID
// and resourceVersion, or "absent".
func (s *secretRefs) version(namespace, name string) string {
	m, ok := s.meta(namespace, name)
	if !ok {
		return "absent"
	}
	return string(m.UID) + "/" + m.ResourceVersion
}

// kubeconfig returns a Config function that reads a kubeconfig from the
// first of keys a Secret holds. what says why the Secret is used ("spec.secretRef
// of GitopsCluster default/dev"), for errors.
func (s *secretRefs) kubeconfig(namespace, name, what string, keys ...string) func(context.Context) (*rest.Config, error) {
	return func(ctx context.Context) (*rest.Config, error) {
		data, key, err := s.read(ctx, namespace, name, what, keys...)
		if err != nil {
			return nil, err
		}
		cfg, err := connection.KubeconfigConfig(data)
		if err != nil {
			return nil, fmt.Errorf("secret %s/%s key %q: %w", namespace, name, key, err)
		}
		return cfg, nil
	}
}

// read returns the first non-empty of keys in a Secret.
func (s *secretRefs) read(ctx context.Context, namespace, name, what string, keys ...string) ([]byte, string, error) {
	if _, ok := s.meta(namespace, name); !ok {
		return nil, "", fmt.Errorf("secret %s/%s (%s) not found", namespace, name, what)
	}
	sec, err := s.c.kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "", fmt.Errorf("secret %s/%s (%s) not found", namespace, name, what)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read secret %s/%s (%s): %w", namespace, name, what, err)
	}
	for _, k := range keys {
		if v := sec.Data[k]; len(v) > 0 {
			return v, k, nil
		}
	}
	return nil, "", fmt.Errorf("secret %s/%s (%s) has no %s key", namespace, name, what, quoteJoin(keys, " or "))
}

func quoteJoin(items []string, sep string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, sep)
}
