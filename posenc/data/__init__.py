"""The data every run trains and evaluates on: corpora (the embedded Python standard library, text
files, Hugging Face datasets), tokenizers, packing to memory-mapped token arrays with document starts,
the random training windows and fixed evaluation windows, and the generated length-generalisation
tasks."""
