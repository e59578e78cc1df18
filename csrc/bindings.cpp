// Python bindings of the kernels: the only file that knows about pybind11.
//
// Arrays are taken as py::array and checked here (dtype, layout, shape) so a
// wrong input is an error naming the argument, never a silent copy of a
// megabyte row. The GIL is released around every kernel call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "kernels/adjust.h"
#include "kernels/dispatch.h"
#include "kernels/logprob.h"
#include "kernels/sample.h"
#include "kernels/softmax.h"
#include "kernels/truncate.h"
#include "kernels/verify.h"
#include "rng.h"

namespace py = pybind11;
using specdec::DistParams;
using specdec::DistResult;
using specdec::Rng;

namespace {

std::string shape_of(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t d = 0; d < a.ndim(); ++d) {
        if (d > 0) s += ", ";
        s += std::to_string(a.shape(d));
    }
    if (a.ndim() == 1) s += ",";
    return s + ")";
}

std::string dtype_of(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

bool is_aligned(const py::array& a) { return (a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0; }

// Checks that `a` is a float32, C-contiguous, aligned array (TypeError otherwise).
void require_float32(const py::array& a, const char* name) {
    if (!py::isinstance<py::array_t<float>>(a)) {
        throw py::type_error(std::string(name) + " must be a float32 array, got dtype " + dtype_of(a) +
                             " (convert it once with .astype(np.float32))");
    }
    if (!(a.flags() & py::array::c_style)) {
        throw py::type_error(
            std::string(name) + " must be C-contiguous (use np.ascontiguousarray), got strides " +
            py::str(py::cast(std::vector<py::ssize_t>(a.strides(), a.strides() + a.ndim()))).cast<std::string>());
    }
    if (!is_aligned(a)) throw py::type_error(std::string(name) + " must be an aligned array");
}

void require_writeable(const py::array& a, const char* name) {
    if (!a.writeable()) throw py::value_error(std::string(name) + " must be writeable");
}

DistParams make_params(double temperature, int64_t top_k, double top_p, double min_p) {
    DistParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    const std::string error = specdec::validate_params(p);
    if (!error.empty()) throw py::value_error(error);
    return p;
}

uint64_t to_u64(py::handle value, const char* name) {
    if (PyBool_Check(value.ptr())) throw py::type_error(std::string(name) + " must be an int, got a bool");
    PyObject* index = PyNumber_Index(value.ptr());
    if (index == nullptr) {
        PyErr_Clear();
        throw py::type_error(std::string(name) + " must be an int, got " +
                             py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>());
    }
    py::object as_int = py::reinterpret_steal<py::object>(index);
    const unsigned long long v = PyLong_AsUnsignedLongLong(as_int.ptr());
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        throw py::value_error(std::string(name) + " must be in [0, 2**64), got " +
                              py::repr(as_int).cast<std::string>());
    }
    return static_cast<uint64_t>(v);
}

// Copies the draft token ids (int32 or int64, 1-D, contiguous) into int64.
std::vector<int64_t> read_tokens(const py::array& tokens, size_t gamma) {
    const bool is32 = py::isinstance<py::array_t<int32_t>>(tokens);
    const bool is64 = py::isinstance<py::array_t<int64_t>>(tokens);
    if (!is32 && !is64) {
        throw py::type_error("draft_tokens must be an int32 (or int64) array, got dtype " + dtype_of(tokens));
    }
    if (!(tokens.flags() & py::array::c_style) || !is_aligned(tokens)) {
        throw py::type_error("draft_tokens must be C-contiguous");
    }
    if (tokens.ndim() != 1 || static_cast<size_t>(tokens.shape(0)) != gamma) {
        throw py::value_error("draft_tokens must have shape (γ,) = (" + std::to_string(gamma) +
                              ",) for target_logits with γ+1 = " + std::to_string(gamma + 1) + " rows, got " +
                              shape_of(tokens));
    }
    std::vector<int64_t> out(gamma);
    if (is32) {
        const int32_t* src = static_cast<const int32_t*>(tokens.data());
        for (size_t i = 0; i < gamma; ++i) out[i] = src[i];
    } else if (gamma > 0) {
        std::memcpy(out.data(), tokens.data(), gamma * sizeof(int64_t));
    }
    return out;
}

const float* read_draft_probs(const py::object& draft_probs, size_t gamma, size_t n_vocab) {
    if (draft_probs.is_none()) return nullptr;
    if (!py::isinstance<py::array>(draft_probs)) {
        throw py::type_error("draft_probs must be a float32 numpy array or None, got " +
                             py::str(py::type::handle_of(draft_probs).attr("__name__")).cast<std::string>());
    }
    py::array q = py::reinterpret_borrow<py::array>(draft_probs);
    require_float32(q, "draft_probs");
    if (q.ndim() != 2 || static_cast<size_t>(q.shape(0)) != gamma || static_cast<size_t>(q.shape(1)) != n_vocab) {
        throw py::value_error("draft_probs must have shape (γ, V) = (" + std::to_string(gamma) + ", " +
                              std::to_string(n_vocab) + "), got " + shape_of(q));
    }
    return static_cast<const float*>(q.data());
}

// The row changes of k rows (kernels/adjust.h), read from the optional
// `mask` ((k, W) uint32, or (W,) when k == 1) and `sparse` (a tuple of
// offsets (k+1,) int64, ids int32, scale_pos, scale_neg and add float32,
// row r's entries at [offsets[r], offsets[r+1])) arguments.  The arrays
// must outlive the returned rows (the caller holds them).
struct Adjustments {
    std::vector<specdec::RowAdjust> rows;
    const specdec::RowAdjust* get() const { return rows.empty() ? nullptr : rows.data(); }
};

template <typename T>
const T* typed_data(const py::array& a, const char* name, const char* dtype) {
    if (!py::isinstance<py::array_t<T>>(a)) {
        throw py::type_error(std::string(name) + " must be a " + dtype + " array, got dtype " + dtype_of(a));
    }
    if (!(a.flags() & py::array::c_style) || !is_aligned(a)) {
        throw py::type_error(std::string(name) + " must be C-contiguous");
    }
    return static_cast<const T*>(a.data());
}

Adjustments read_adjustments(const py::object& mask, const py::object& sparse, size_t k, size_t n_vocab) {
    Adjustments adj;
    if (mask.is_none() && sparse.is_none()) return adj;
    adj.rows.resize(k);
    const size_t words = (n_vocab + 31) / 32;
    if (!mask.is_none()) {
        if (!py::isinstance<py::array>(mask)) throw py::type_error("mask must be a uint32 numpy array or None");
        py::array m = py::reinterpret_borrow<py::array>(mask);
        const uint32_t* data = typed_data<uint32_t>(m, "mask", "uint32");
        const bool one = m.ndim() == 1 && k == 1 && static_cast<size_t>(m.shape(0)) == words;
        const bool many =
            m.ndim() == 2 && static_cast<size_t>(m.shape(0)) == k && static_cast<size_t>(m.shape(1)) == words;
        if (!one && !many) {
            throw py::value_error("mask must have shape (" + std::to_string(k) + ", " + std::to_string(words) +
                                  ") (rows, ceil(V/32) words), got " + shape_of(m));
        }
        for (size_t r = 0; r < k; ++r) adj.rows[r].mask = data + r * words;
    }
    if (!sparse.is_none()) {
        if (!py::isinstance<py::tuple>(sparse) || py::len(sparse) != 5) {
            throw py::type_error("sparse must be a tuple (offsets, ids, scale_pos, scale_neg, add) or None");
        }
        py::tuple t = py::reinterpret_borrow<py::tuple>(sparse);
        py::array offsets = t[0].cast<py::array>(), ids = t[1].cast<py::array>();
        py::array pos = t[2].cast<py::array>(), neg = t[3].cast<py::array>(), add = t[4].cast<py::array>();
        const int64_t* off = typed_data<int64_t>(offsets, "sparse offsets", "int64");
        if (offsets.ndim() != 1 || static_cast<size_t>(offsets.shape(0)) != k + 1) {
            throw py::value_error("sparse offsets must have shape (" + std::to_string(k + 1) + ",), got " +
                                  shape_of(offsets));
        }
        const size_t m = static_cast<size_t>(ids.size());
        const int32_t* id = typed_data<int32_t>(ids, "sparse ids", "int32");
        const float* sp = typed_data<float>(pos, "sparse scale_pos", "float32");
        const float* sn = typed_data<float>(neg, "sparse scale_neg", "float32");
        const float* ad = typed_data<float>(add, "sparse add", "float32");
        if (static_cast<size_t>(pos.size()) != m || static_cast<size_t>(neg.size()) != m ||
            static_cast<size_t>(add.size()) != m) {
            throw py::value_error("sparse ids, scale_pos, scale_neg and add must have the same length");
        }
        for (size_t j = 0; j < m; ++j) {
            if (!(std::isfinite(sp[j]) && sp[j] > 0.0f && std::isfinite(sn[j]) && sn[j] > 0.0f)) {
                throw py::value_error("sparse scales must be positive and finite");
            }
            if (std::isnan(ad[j]) || ad[j] == std::numeric_limits<float>::infinity()) {
                throw py::value_error("sparse add must be finite or -inf (a ban)");
            }
        }
        for (size_t r = 0; r < k; ++r) {
            if (off[r] < 0 || off[r] > off[r + 1] || static_cast<size_t>(off[r + 1]) > m) {
                throw py::value_error("sparse offsets must be non-decreasing within [0, " + std::to_string(m) + "]");
            }
            specdec::RowAdjust& row = adj.rows[r];
            row.ids = id + off[r];
            row.scale_pos = sp + off[r];
            row.scale_neg = sn + off[r];
            row.add = ad + off[r];
            row.n_ids = static_cast<size_t>(off[r + 1] - off[r]);
        }
    }
    return adj;
}

py::tuple run_verify(const float* logits, size_t k, size_t n_vocab, const py::array& draft_tokens,
                     const py::object& draft_probs, const DistParams& params, Rng& rng, const py::object& mask,
                     const py::object& sparse) {
    const size_t gamma = k - 1;
    const std::vector<int64_t> tokens = read_tokens(draft_tokens, gamma);
    const float* q = read_draft_probs(draft_probs, gamma, n_vocab);
    const Adjustments adj = read_adjustments(mask, sparse, k, n_vocab);
    specdec::VerifyOutcome outcome;
    {
        py::gil_scoped_release release;
        specdec::verify_step(logits, k, n_vocab, tokens.data(), q, params, rng, &outcome, adj.get());
    }
    py::array_t<double> alphas(static_cast<py::ssize_t>(outcome.alphas.size()));
    if (!outcome.alphas.empty()) {
        std::memcpy(alphas.mutable_data(), outcome.alphas.data(), outcome.alphas.size() * sizeof(double));
    }
    return py::make_tuple(outcome.n_accepted, outcome.token, alphas);
}

void translate_invalid_logits(std::exception_ptr p) {
    try {
        if (p) std::rethrow_exception(p);
    } catch (const specdec::InvalidLogits& e) {
        py::object cls;
        PyObject* type = PyExc_ValueError;
        try {
            cls = py::module_::import("specdec_cpu.errors").attr("InvalidLogitsError");
            type = cls.ptr();
        } catch (const py::error_already_set&) {
            // Fall back to ValueError (InvalidLogitsError subclasses it).
        }
        PyErr_SetString(type, e.what());
    }
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "specdec-cpu vocabulary-wide kernels (C++). Use specdec_cpu.sampling instead of this module.";

    {
        std::string error;
        if (!specdec::init_isa_from_environment(&error)) throw std::runtime_error(error);
    }
    py::register_exception_translator(&translate_invalid_logits);

    m.def(
        "active_isa", []() { return std::string(specdec::active_isa_name()); },
        "The instruction set the kernels run on: 'scalar', 'avx2', 'avx512' or 'neon'.");
    m.def("supported_isas", &specdec::supported_isas, "Instruction sets this CPU can run, slowest first.");
    m.def(
        "set_isa",
        [](const std::string& name) {
            std::string error;
            if (!specdec::set_isa(name, &error)) throw py::value_error(error);
        },
        py::arg("name"), "Force a kernel path by name (ValueError if unknown or unsupported here).");

    py::class_<Rng>(m, "Rng", "Counter-based random generator (Philox-4x32-10): Rng(seed, stream=0).")
        .def(py::init([](py::object seed, py::object stream) {
                 return Rng(to_u64(seed, "seed"), to_u64(stream, "stream"));
             }),
             py::arg("seed"), py::arg("stream") = 0)
        .def("uniform", &Rng::uniform, "Next uniform double in [0, 1) (53 random bits).")
        .def_property_readonly("seed", [](const Rng& r) { return r.seed; })
        .def_property_readonly("stream", [](const Rng& r) { return r.stream; })
        .def_property_readonly(
            "counter", [](const Rng& r) { return r.counter; }, "Draws made so far.")
        .def("__repr__", [](const Rng& r) {
            return "Rng(seed=" + std::to_string(r.seed) + ", stream=" + std::to_string(r.stream) +
                   ", counter=" + std::to_string(r.counter) + ")";
        });

    m.def(
        "distribution",
        [](py::array logits, double temperature, int64_t top_k, double top_p, double min_p, py::object mask,
           py::object sparse) {
            require_float32(logits, "logits");
            const DistParams params = make_params(temperature, top_k, top_p, min_p);
            if (logits.ndim() != 1 && logits.ndim() != 2) {
                throw py::value_error("logits must have shape (V,) or (n, V), got " + shape_of(logits));
            }
            const bool single = logits.ndim() == 1;
            const size_t rows = single ? 1 : static_cast<size_t>(logits.shape(0));
            const size_t n_vocab = static_cast<size_t>(logits.shape(logits.ndim() - 1));
            if (n_vocab == 0) throw py::value_error("logits must have at least one token, got " + shape_of(logits));
            const Adjustments adj = read_adjustments(mask, sparse, rows, n_vocab);
            std::vector<py::ssize_t> shape(logits.shape(), logits.shape() + logits.ndim());
            py::array_t<float> out(shape);
            const float* src = static_cast<const float*>(logits.data());
            float* dst = out.mutable_data();
            {
                py::gil_scoped_release release;
                specdec::Workspace& ws = specdec::thread_workspace();
                for (size_t r = 0; r < rows; ++r) {
                    const int64_t at = single ? -1 : static_cast<int64_t>(r);
                    const float* row =
                        specdec::adjusted_row(src + r * n_vocab, n_vocab,
                                              adj.get() != nullptr ? adj.get() + r : nullptr, ws.adj, "logits", at);
                    specdec::compute_distribution(row, n_vocab, params, dst + r * n_vocab, ws, "logits", at);
                }
            }
            return out;
        },
        py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
        py::arg("mask") = py::none(), py::arg("sparse") = py::none(),
        "Final sampling distribution of logits (V,) or (n, V) float32 (each row adjusted by mask and sparse "
        "first); returns a new float32 array.");

    m.def(
        "sample",
        [](py::array logits, double temperature, int64_t top_k, double top_p, double min_p, Rng& rng, py::object mask,
           py::object sparse) {
            require_float32(logits, "logits");
            const DistParams params = make_params(temperature, top_k, top_p, min_p);
            if (logits.ndim() != 1 || logits.shape(0) == 0) {
                throw py::value_error("logits must have shape (V,) with V >= 1, got " + shape_of(logits));
            }
            const size_t n = static_cast<size_t>(logits.shape(0));
            const Adjustments adj = read_adjustments(mask, sparse, 1, n);
            const float* src = static_cast<const float*>(logits.data());
            int64_t token;
            {
                py::gil_scoped_release release;
                specdec::Workspace& ws = specdec::thread_workspace();
                ws.reserve(n);
                float* p = ws.p.data();
                const float* row = specdec::adjusted_row(src, n, adj.get(), ws.adj, "logits", -1);
                const DistResult dist = specdec::compute_distribution(row, n, params, p, ws, "logits", -1);
                token = specdec::sample_distribution(p, n, dist, rng, ws);
            }
            return token;
        },
        py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("rng"),
        py::arg("mask") = py::none(), py::arg("sparse") = py::none(),
        "Draw one token id from the distribution of a logits row (V,) (adjusted by mask and sparse first).");

    m.def(
        "sample_into",
        [](py::array logits, double temperature, int64_t top_k, double top_p, double min_p, Rng& rng, py::array out,
           py::object mask, py::object sparse) {
            require_float32(logits, "logits");
            require_float32(out, "out");
            require_writeable(out, "out");
            const DistParams params = make_params(temperature, top_k, top_p, min_p);
            if (logits.ndim() != 1 || logits.shape(0) == 0) {
                throw py::value_error("logits must have shape (V,) with V >= 1, got " + shape_of(logits));
            }
            const size_t n = static_cast<size_t>(logits.shape(0));
            if (out.ndim() != 1 || static_cast<size_t>(out.shape(0)) < n) {
                throw py::value_error("out must have shape (V_out,) with V_out >= " + std::to_string(n) +
                                      " (the length of logits), got " + shape_of(out));
            }
            const size_t n_out = static_cast<size_t>(out.shape(0));
            const Adjustments adj = read_adjustments(mask, sparse, 1, n);
            const float* src = static_cast<const float*>(logits.data());
            float* dst = static_cast<float*>(out.mutable_data());
            int64_t token;
            {
                py::gil_scoped_release release;
                specdec::Workspace& ws = specdec::thread_workspace();
                const float* row = specdec::adjusted_row(src, n, adj.get(), ws.adj, "logits", -1);
                const DistResult dist = specdec::compute_distribution(row, n, params, dst, ws, "logits", -1);
                if (n_out > n) std::memset(dst + n, 0, (n_out - n) * sizeof(float));
                token = specdec::sample_distribution(dst, n, dist, rng, ws);
            }
            return token;
        },
        py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("rng"),
        py::arg("out"), py::arg("mask") = py::none(), py::arg("sparse") = py::none(),
        "Write the distribution of logits (V_in,) (adjusted by mask and sparse first) into out[:V_in] (zeros "
        "after) and draw a token from it.");

    m.def(
        "acceptance_rate",
        [](py::array p, py::array q) {
            require_float32(p, "p");
            require_float32(q, "q");
            if (p.ndim() != 1) throw py::value_error("p must have shape (V,), got " + shape_of(p));
            if (q.ndim() != 1 || q.shape(0) != p.shape(0)) {
                throw py::value_error("q must have the shape of p " + shape_of(p) + ", got " + shape_of(q));
            }
            const size_t n = static_cast<size_t>(p.shape(0));
            const float* pp = static_cast<const float*>(p.data());
            const float* qq = static_cast<const float*>(q.data());
            double a;
            {
                py::gil_scoped_release release;
                a = specdec::acceptance_rate(pp, qq, n);
            }
            return a;
        },
        py::arg("p"), py::arg("q"), "Σ min(p, q) of two float32 rows (V,).");

    m.def(
        "verify",
        [](py::array target_logits, py::array draft_tokens, py::object draft_probs, double temperature, int64_t top_k,
           double top_p, double min_p, Rng& rng, py::object mask, py::object sparse) {
            require_float32(target_logits, "target_logits");
            const DistParams params = make_params(temperature, top_k, top_p, min_p);
            if (target_logits.ndim() != 2 || target_logits.shape(0) < 1 || target_logits.shape(1) < 1) {
                throw py::value_error("target_logits must have shape (γ+1, V) with γ >= 0 and V >= 1, got " +
                                      shape_of(target_logits));
            }
            const size_t k = static_cast<size_t>(target_logits.shape(0));
            const size_t n_vocab = static_cast<size_t>(target_logits.shape(1));
            return run_verify(static_cast<const float*>(target_logits.data()), k, n_vocab, draft_tokens, draft_probs,
                              params, rng, mask, sparse);
        },
        py::arg("target_logits"), py::arg("draft_tokens"), py::arg("draft_probs"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("rng"), py::arg("mask") = py::none(),
        py::arg("sparse") = py::none(),
        "Exact speculative verification of one step (each row adjusted by its mask and sparse changes first); "
        "returns (n_accepted, token, alphas).");

    m.def(
        "verify_ptr",
        [](py::object address, int64_t n_rows, int64_t n_vocab, py::array draft_tokens, py::object draft_probs,
           double temperature, int64_t top_k, double top_p, double min_p, Rng& rng, py::object mask,
           py::object sparse) {
            const uint64_t addr = to_u64(address, "address");
            if (addr == 0) throw py::value_error("address must be a non-null pointer to float32 logits");
            if (addr % alignof(float) != 0) throw py::value_error("address must be aligned to 4 bytes");
            if (n_rows < 1) throw py::value_error("n_rows must be >= 1 (γ+1 rows), got " + std::to_string(n_rows));
            if (n_vocab < 1) throw py::value_error("n_vocab must be >= 1, got " + std::to_string(n_vocab));
            if (static_cast<uint64_t>(n_rows) > (UINT64_MAX / 4) / static_cast<uint64_t>(n_vocab)) {
                throw py::value_error("n_rows * n_vocab is too large");
            }
            const DistParams params = make_params(temperature, top_k, top_p, min_p);
            const float* logits = reinterpret_cast<const float*>(static_cast<uintptr_t>(addr));
            return run_verify(logits, static_cast<size_t>(n_rows), static_cast<size_t>(n_vocab), draft_tokens,
                              draft_probs, params, rng, mask, sparse);
        },
        py::arg("address"), py::arg("n_rows"), py::arg("n_vocab"), py::arg("draft_tokens"), py::arg("draft_probs"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("rng"),
        py::arg("mask") = py::none(), py::arg("sparse") = py::none(),
        "verify() over n_rows x n_vocab float32 logits at a raw address (no copy).");

    m.def(
        "logprobs",
        [](py::array logits, py::array tokens, int64_t top_n, bool sampling, double temperature, int64_t top_k,
           double top_p, double min_p, py::object mask, py::object sparse) {
            require_float32(logits, "logits");
            if (logits.ndim() != 2 || logits.shape(0) < 1 || logits.shape(1) < 1) {
                throw py::value_error("logits must have shape (k, V) with k, V >= 1, got " + shape_of(logits));
            }
            const size_t k = static_cast<size_t>(logits.shape(0));
            const size_t n = static_cast<size_t>(logits.shape(1));
            if (top_n < 0 || static_cast<size_t>(top_n) > n) {
                throw py::value_error("top_n must be in [0, " + std::to_string(n) + "], got " + std::to_string(top_n));
            }
            if (tokens.ndim() != 1 || static_cast<size_t>(tokens.shape(0)) != k) {
                throw py::value_error("tokens must have shape (" + std::to_string(k) + ",) (one per row), got " +
                                      shape_of(tokens));
            }
            std::vector<int64_t> ids(k);
            if (py::isinstance<py::array_t<int64_t>>(tokens)) {
                auto v = tokens.cast<py::array_t<int64_t>>().unchecked<1>();
                for (size_t r = 0; r < k; ++r) ids[r] = v(r);
            } else if (py::isinstance<py::array_t<int32_t>>(tokens)) {
                auto v = tokens.cast<py::array_t<int32_t>>().unchecked<1>();
                for (size_t r = 0; r < k; ++r) ids[r] = v(r);
            } else {
                throw py::type_error("tokens must be an int32 or int64 array, got dtype " + dtype_of(tokens));
            }
            for (size_t r = 0; r < k; ++r) {
                if (ids[r] < 0 || static_cast<size_t>(ids[r]) >= n) {
                    throw py::value_error("tokens[" + std::to_string(r) + "] = " + std::to_string(ids[r]) +
                                          " is outside the vocabulary [0, " + std::to_string(n) + ")");
                }
            }
            const DistParams params = make_params(temperature, top_k, top_p, min_p);
            const Adjustments adj = sampling ? read_adjustments(mask, sparse, k, n) : Adjustments();
            const size_t t = static_cast<size_t>(top_n);
            py::array_t<float> token_lp(static_cast<py::ssize_t>(k));
            py::array_t<int32_t> top_ids({static_cast<py::ssize_t>(k), static_cast<py::ssize_t>(t)});
            py::array_t<float> top_lp({static_cast<py::ssize_t>(k), static_cast<py::ssize_t>(t)});
            const float* src = static_cast<const float*>(logits.data());
            float* out_lp = token_lp.mutable_data();
            int32_t* out_ids = top_ids.mutable_data();
            float* out_top = top_lp.mutable_data();
            {
                py::gil_scoped_release release;
                specdec::Workspace& ws = specdec::thread_workspace();
                std::vector<float> dist(sampling ? n : 0);
                for (size_t r = 0; r < k; ++r) {
                    const int64_t at = static_cast<int64_t>(r);
                    const float* row = src + r * n;
                    if (sampling) {  // the distribution the token was sampled from
                        row = specdec::adjusted_row(row, n, adj.get() != nullptr ? adj.get() + r : nullptr, ws.adj,
                                                    "logits", at);
                        specdec::compute_distribution(row, n, params, dist.data(), ws, "logits", at);
                        row = dist.data();
                    }
                    specdec::row_logprobs(row, n, sampling, ids[r], t, out_lp + r, out_ids + r * t, out_top + r * t, ws,
                                          "logits", at);
                }
            }
            return py::make_tuple(token_lp, top_ids, top_lp);
        },
        py::arg("logits"), py::arg("tokens"), py::arg("top_n"), py::arg("sampling"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("mask") = py::none(),
        py::arg("sparse") = py::none(),
        "Log-probabilities of tokens (k,) under rows (k, V): of the model's own distribution (log softmax at "
        "T = 1; sampling=False) or of the sampling distribution (each row adjusted by mask and sparse, then the "
        "chain; sampling=True). Returns (token_logprobs (k,), top_ids (k, top_n), top_logprobs (k, top_n)).");

    m.def(
        "_exp",
        [](py::array x) {
            require_float32(x, "x");
            py::array_t<float> out(static_cast<py::ssize_t>(x.size()));
            const float* src = static_cast<const float*>(x.data());
            float* dst = out.mutable_data();
            const size_t n = static_cast<size_t>(x.size());
            {
                py::gil_scoped_release release;
                specdec::kernels().exp_array(src, n, dst);
            }
            return out;
        },
        py::arg("x"), "Elementwise exp of the active kernel path (flattened; for accuracy tests).");
}
