// kvlab's compiled Python module (_kvlab, imported by the package python/kvlab): load a
// checkpoint or make a random model, run naive and cached decode, and read logits, K and V rows
// and attention weights as numpy arrays. kvlab.verify lives in the package's __init__.py.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cassert>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "build_info.h"
#include "cache_factory.h"
#include "decode.h"
#include "model_loader.h"

namespace py = pybind11;
using namespace kvlab;

namespace {

// ----------------------------------------------------------------------------------------------
// Models and decoders

struct PyModel {
    LoadedModel loaded;
    const Config& config() const { return loaded.model.config(); }
};

std::vector<int> checked_tokens(const PyModel& m, const std::vector<int>& tokens) {
    for (std::size_t i = 0; i < tokens.size(); i++)
        if (tokens[i] < 0 || tokens[i] >= m.config().vocab_size)
            throw Error(
                fmt::format("token {} at {} is outside the vocabulary [0, {})", tokens[i], i, m.config().vocab_size));
    return tokens;
}

py::array_t<float> array(const std::vector<float>& v, std::vector<py::ssize_t> shape) {
    py::array_t<float> a(shape);
    assert(std::size_t(a.size()) == v.size());
    std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(float));
    return a;
}

// A cached decoder on a cache variant of its own, watching every step's attention weights.
class PyDecoder {
public:
    PyDecoder(const PyModel& m, const std::string& variant, const std::string& settings)
        : model_(m), probe_(std::make_unique<AttentionProbe>()) {
        const auto v = parse_variant(variant);
        if (!v) throw Error(fmt::format("unknown cache variant '{}' ({})", variant, variant_names(all_variants())));
        CacheSpec spec = default_spec(*v, m.config());
        if (!settings.empty()) apply_settings(spec, settings);
        made_ = make_cache(m.config(), spec);
        decoder_ = std::make_unique<CachedDecoder>(m.loaded.model, *made_.cache);
        decoder_->observer = probe_.get();
    }
    py::array_t<float> prefill(const std::vector<int>& tokens) {
        return logits(decoder_->prefill(checked_tokens(model_, tokens)));
    }
    py::array_t<float> decode(int token) { return prefill({token}); }
    py::array_t<float> prefill_rows(const std::vector<int>& tokens) {
        const std::vector<float>& all = decoder_->prefill_rows(checked_tokens(model_, tokens));
        return array(all, {py::ssize_t(tokens.size()), model_.config().vocab_size});
    }
    void rollback(int n) { decoder_->cache().truncate(n); }
    int length() const { return decoder_->cache().length(); }
    std::vector<int> tokens() const {
        const auto t = decoder_->cache().tokens();
        return {t.begin(), t.end()};
    }
    std::string cache_name() const { return decoder_->cache().name(); }
    // Layer l's K (or V) rows of every held position, as attention reads them: [n_kv_heads, T, head_size].
    py::array_t<float> rows(int l, bool values) const {
        const Config& c = model_.config();
        const Cache& cache = decoder_->cache();
        const int T = cache.length(), hs = c.head_size();
        std::vector<float> out(std::size_t(c.n_kv_heads) * T * hs);  // [n_kv_heads, T, head_size]
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int t = 0; t < T; t++)
                std::memcpy(out.data() + (std::size_t(h) * T + t) * hs,
                            values ? cache.value(l, h, t) : cache.key(l, h, t), std::size_t(hs) * sizeof(float));
        return array(out, {c.n_kv_heads, T, hs});
    }
    // The last step's last row: its attention weights, [n_layers, n_heads, positions attended].
    py::array_t<float> attention() const {
        const Config& c = model_.config();
        const int n = probe_->n;
        if (probe_->weights.empty()) throw Error("no step has run yet: no attention weights to read");
        std::vector<float> out(std::size_t(c.n_layers) * c.n_heads * n);  // [n_layers, n_heads, n]
        for (int lh = 0; lh < c.n_layers * c.n_heads; lh++)
            std::memcpy(out.data() + std::size_t(lh) * n, probe_->weights.data() + std::size_t(lh) * c.max_seq,
                        std::size_t(n) * sizeof(float));
        return array(out, {c.n_layers, c.n_heads, n});
    }

private:
    py::array_t<float> logits(const std::vector<float>& v) const { return array(v, {model_.config().vocab_size}); }
    const PyModel& model_;
    std::unique_ptr<AttentionProbe> probe_;
    CacheAndPool made_;
    std::unique_ptr<CachedDecoder> decoder_;
};

py::dict config_dict(const Config& c) {
    py::dict d;
    d["dim"] = c.dim, d["hidden_dim"] = c.hidden_dim, d["n_layers"] = c.n_layers, d["n_heads"] = c.n_heads;
    d["n_kv_heads"] = c.n_kv_heads, d["vocab_size"] = c.vocab_size, d["max_seq"] = c.max_seq;
    d["head_size"] = c.head_size(), d["kv_dim"] = c.kv_dim();
    return d;
}

void bind_models(py::module_& m) {
    py::class_<PyModel>(m, "Model",
                        "A model: a llama2.c checkpoint (kvlab.load) or random weights (kvlab.random_model).")
        .def_property_readonly("config", [](const PyModel& p) { return config_dict(p.config()); })
        .def_property_readonly("source", [](const PyModel& p) { return p.loaded.source; })
        .def(
            "encode",
            [](const PyModel& p, const std::string& text) {
                if (!p.loaded.tokenizer) throw Error("this model has no tokenizer");
                return encode_prompt(*p.loaded.tokenizer, text, p.config().max_seq, 0, "");
            },
            py::arg("text"), "Token ids of text, with BOS, as llama2.c encodes a prompt.");
    m.def(
        "load",
        [](const std::string& path, const std::string& tokenizer) {
            if (path.empty()) throw Error("kvlab.load: give a checkpoint path");
            return std::make_unique<PyModel>(PyModel{load_model(path, tokenizer, Config{}, 0, "off")});
        },
        py::arg("path"), py::arg("tokenizer") = "", "Loads a llama2.c checkpoint (and a tokenizer, if given).");
    m.def(
        "random_model",
        [](int dim, int hidden_dim, int n_layers, int n_heads, int n_kv_heads, int vocab_size, int max_seq,
           std::uint64_t seed) {
            const Config c{dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq};
            c.validate();
            return std::make_unique<PyModel>(
                PyModel{LoadedModel{random_model(c, seed), std::nullopt, fmt::format("random (seed {})", seed)}});
        },
        py::arg("dim") = 16, py::arg("hidden_dim") = 32, py::arg("n_layers") = 2, py::arg("n_heads") = 4,
        py::arg("n_kv_heads") = 2, py::arg("vocab_size") = 32, py::arg("max_seq") = 32, py::arg("seed") = 1,
        "A model with random weights of this shape.");
    m.def(
        "naive_logits",
        [](const PyModel& p, const std::vector<int>& tokens) {
            if (tokens.empty()) throw Error("naive_logits: give at least one token");
            NaiveDecoder naive(p.loaded.model);
            return array(naive.forward(checked_tokens(p, tokens)), {p.config().vocab_size});
        },
        py::arg("model"), py::arg("tokens"), "Naive decode: the logits after a full forward over tokens, no cache.");
}

void bind_decoder(py::module_& m) {
    py::class_<PyDecoder>(m, "Decoder", "Cached decode on a cache variant (kvlab verify --list names them).")
        .def(py::init<const PyModel&, const std::string&, const std::string&>(), py::arg("model"),
             py::arg("cache") = "contiguous-head", py::arg("settings") = "", py::keep_alive<1, 2>())
        .def("prefill", &PyDecoder::prefill, py::arg("tokens"), "Runs tokens in one step; the last row's logits.")
        .def("decode", &PyDecoder::decode, py::arg("token"), "Runs one token; its logits.")
        .def("prefill_rows", &PyDecoder::prefill_rows, py::arg("tokens"), "Every row's logits: [n, vocab_size].")
        .def("rollback", &PyDecoder::rollback, py::arg("n"), "Forgets positions n and later.")
        .def_property_readonly("length", &PyDecoder::length)
        .def_property_readonly("tokens", &PyDecoder::tokens)
        .def_property_readonly("cache", &PyDecoder::cache_name)
        .def(
            "keys", [](const PyDecoder& d, int l) { return d.rows(l, false); }, py::arg("layer"),
            "Layer l's K rows as attention reads them: [n_kv_heads, length, head_size].")
        .def(
            "values", [](const PyDecoder& d, int l) { return d.rows(l, true); }, py::arg("layer"),
            "Layer l's V rows: [n_kv_heads, length, head_size].")
        .def("attention", &PyDecoder::attention,
             "The last step's last row's attention weights: [n_layers, n_heads, positions].");
}

}  // namespace

PYBIND11_MODULE(_kvlab, m) {
    m.doc() = "kvlab: naive and cached decode side by side, bit for bit, and exactness checks for KV caches.";
    py::register_exception<Error>(m, "Error", PyExc_ValueError);
    bind_models(m);
    bind_decoder(m);
    // Which kvlab this is (core/build_info.h), as `kvlab --version` and the JSON outputs say it.
    m.attr("__version__") = build_info().version;
    m.def(
        "build_info",
        [] {
            const BuildInfo& b = build_info();
            return py::dict(py::arg("version") = b.version, py::arg("commit") = b.commit,
                            py::arg("compiler") = b.compiler, py::arg("build_type") = b.build_type,
                            py::arg("sanitizers") = b.sanitizers, py::arg("native") = b.native);
        },
        "The version, commit, compiler and build type of this module's kvlab.");
}
