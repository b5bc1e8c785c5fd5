//go:build stheno_cuda

package backend

// dlopen and dlsym for the libraries opened at run time (dlopen.go says
// why and which). dlerror's message is kept per thread, so each C helper
// reads it in the same call as the dlopen or dlsym it explains.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static void* sth_dlopen(const char* name, char* err, size_t errsize) {
	dlerror();
	void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char* e = dlerror();
		snprintf(err, errsize, "%s", e != NULL ? e : "dlopen failed without a message");
	}
	return h;
}

// A symbol's address may legitimately be NULL; only dlerror tells.
static void* sth_dlsym(void* h, const char* name, char* err, size_t errsize) {
	dlerror();
	void* p = dlsym(h, name);
	const char* e = dlerror();
	if (e != NULL) {
		snprintf(err, errsize, "%s", e);
		return NULL;
	}
	if (p == NULL) snprintf(err, errsize, "%s: the symbol's address is NULL", name);
	return p;
}

static int sth_dlclose(void* h, char* err, size_t errsize) {
	dlerror();
	int r = dlclose(h);
	if (r != 0) {
		const char* e = dlerror();
		snprintf(err, errsize, "%s", e != NULL ? e : "dlclose failed without a message");
	}
	return r;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// dynLib is a library opened with dlopen. A library in use stays open for
// the life of the process: the handles and function pointers taken from it
// may be in use anywhere, and unloading a library that started threads of
// its own (cuBLAS's CUDA runtime does) is not safe. Only one found
// unusable (a function missing) is closed again.
type dynLib struct {
	name string // as opened: a soname or a path
	h    unsafe.Pointer
}

const dlErrSize = 1024

// dlopen opens name (a soname for the loader's search, or a path) with
// RTLD_NOW, so that missing dependencies fail here and not at a first call.
func dlopen(name string) (*dynLib, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	msg := (*C.char)(C.calloc(dlErrSize, 1))
	defer C.free(unsafe.Pointer(msg))
	h := C.sth_dlopen(cname, msg, dlErrSize)
	if h == nil {
		return nil, errors.New(C.GoString(msg))
	}
	return &dynLib{name: name, h: h}, nil
}

// sym returns the address of symbol name (its default version, for
// libraries such as cuBLAS that version their symbols).
func (l *dynLib) sym(name string) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	msg := (*C.char)(C.calloc(dlErrSize, 1))
	defer C.free(unsafe.Pointer(msg))
	p := C.sth_dlsym(l.h, cname, msg, dlErrSize)
	if p == nil {
		return nil, errors.New(C.GoString(msg))
	}
	return p, nil
}

// close unloads the library; see dynLib for when that is safe.
func (l *dynLib) close() error {
	msg := (*C.char)(C.calloc(dlErrSize, 1))
	defer C.free(unsafe.Pointer(msg))
	if C.sth_dlclose(l.h, msg, dlErrSize) != 0 {
		return fmt.Errorf("dlclose %s: %s", l.name, C.GoString(msg))
	}
	return nil
}
