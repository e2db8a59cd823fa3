package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// sourcedCRD is a CRD and the file it came from, for error messages.
type sourcedCRD struct {
	file string
	crd  apiextensionsv1.CustomResourceDefinition
}

// loadCRDs reads every *.yaml file of dir (each may hold several documents),
// strictly: an unknown or duplicate key, or a document that is not an
// apiextensions.k8s.io/v1 CustomResourceDefinition, is an error naming the
// file. The result is ordered by group, then kind, whatever the file names.
func loadCRDs(dir string) ([]sourcedCRD, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var crds []sourcedCRD
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for doc := 1; ; doc++ {
			raw, err := reader.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", file, doc, err)
			}
			if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("---")) {
				continue
			}
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", file, doc, err)
			}
			if crd.APIVersion != "apiextensions.k8s.io/v1" || crd.Kind != "CustomResourceDefinition" {
				return nil, fmt.Errorf("%s: document %d is %s %s, not an apiextensions.k8s.io/v1 CustomResourceDefinition", file, doc, crd.APIVersion, crd.Kind)
			}
			crds = append(crds, sourcedCRD{file: file, crd: crd})
		}
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("%s: no CustomResourceDefinition in any *.yaml file", dir)
	}
	sort.SliceStable(crds, func(i, j int) bool {
		a, b := crds[i].crd.Spec, crds[j].crd.Spec
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		return a.Names.Kind < b.Names.Kind
	})
	return crds, nil
}
