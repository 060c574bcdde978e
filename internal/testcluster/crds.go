package testcluster

import (
	"bytes"
	"context"
	_ "embed" // CRD fixtures
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// IstioCRDs is the CRD manifest that istio.io/api ships.
//
//go:embed testdata/istio-crds.yaml
var IstioCRDs []byte

// FluxCRDs holds minimal structural CRDs for the Flux kinds.
//
//go:embed testdata/flux-crds.yaml
var FluxCRDs []byte

// SourceCRDs holds minimal structural CRDs for the cluster inventories
// fleetgraph reads: GitopsCluster, Cluster API Cluster and ClusterProfile.
//
//go:embed testdata/source-crds.yaml
var SourceCRDs []byte

// MonitoringCRDs holds minimal structural CRDs for the Prometheus
// Operator's ServiceMonitor and PrometheusRule.
//
//go:embed testdata/monitoring-crds.yaml
var MonitoringCRDs []byte

// crdEstablishTimeout bounds the wait for new CRDs to be served.
const crdEstablishTimeout = 60 * time.Second

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallIstioCRDs installs the Istio CRDs and waits until they are served.
func (c *Cluster) InstallIstioCRDs(ctx context.Context) error {
	return c.InstallCRDs(ctx, IstioCRDs)
}

// InstallFluxCRDs installs the Flux CRDs and waits until they are served.
func (c *Cluster) InstallFluxCRDs(ctx context.Context) error {
	return c.InstallCRDs(ctx, FluxCRDs)
}

// InstallSourceCRDs installs the cluster-inventory CRDs and waits until
// they are served.
func (c *Cluster) InstallSourceCRDs(ctx context.Context) error {
	return c.InstallCRDs(ctx, SourceCRDs)
}

// InstallCRDs creates every CustomResourceDefinition in a multi-document
// YAML manifest, skipping ones that exist, and waits until all are
// established. It uses the direct connection, so it works while the proxy
// is faulted.
func (c *Cluster) InstallCRDs(ctx context.Context, manifest []byte) error {
	client, err := dynamic.NewForConfig(c.DirectConfig)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	crds := client.Resource(crdResource)
	var names []string
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 64<<10)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("decode CRD manifest: %w", err)
		}
		if obj.Object == nil {
			continue // empty document
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			return fmt.Errorf("manifest holds a %s, not a CustomResourceDefinition", obj.GetKind())
		}
		if _, err := crds.Create(ctx, &obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, crdEstablishTimeout, true, func(ctx context.Context) (bool, error) {
			obj, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}
